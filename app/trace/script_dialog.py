"""Trace panel → "Trace a script…": script, arguments, working directory and target; the script's
output live while it runs; then its report in the panel, its saved run, and a diff with another."""

from __future__ import annotations

import time

from opscope.app.trace.script_job import ScriptTraceJob, ScriptTraceRequest
from PySide6.QtCore import QTimer, Signal
from PySide6.QtGui import QFontDatabase, QTextCursor
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QFileDialog,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

TARGETS = (("default (cuda when available, else cpu)", ""), ("cpu", "cpu"), ("cuda", "cuda"))


class ScriptTraceDialog(QDialog):
    report_ready = Signal(dict)  # ScriptTraceJob's finished payload

    def __init__(self, db_url: str | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Trace a script")
        self.db_url = db_url
        self.job = ScriptTraceJob(self)
        self.job.output.connect(self._append)
        self.job.finished.connect(self._on_finished)
        self.job.diagnosed.connect(self._on_diagnosed)
        self.job.failed.connect(self._on_failed)
        self.diagnosis: list[str] = []
        self.last_run: str | None = None
        self._t0 = 0.0
        self._timer = QTimer(self, interval=500, timeout=self._tick)
        self._build()

    def _build(self) -> None:
        self.script, self.args, self.cwd = QLineEdit(), QLineEdit(), QLineEdit()
        self.script.setPlaceholderText("train.py")
        self.args.setPlaceholderText("--epochs 1 --lr 3e-4")
        self.cwd.setPlaceholderText("(the current folder)")
        self.target = QComboBox()
        for label, value in TARGETS:
            self.target.addItem(label, value)
        self.run_button = QPushButton("Trace", objectName="primary", clicked=self.run)
        self.stop_button = QPushButton("Stop", clicked=self.job.cancel, enabled=False)
        self.diagnose_button = QPushButton(
            "Diagnose",
            clicked=lambda: self.run(diagnose=True),
            toolTip="why is it slow: `opscope diagnose -- python SCRIPT`",
        )
        self.output = QPlainTextEdit(readOnly=True)
        self.output.setFont(QFontDatabase.systemFont(QFontDatabase.FixedFont))
        self.status = QLabel(
            "The script runs in its own process under the tracer; its output shows here.",
            objectName="statsLine",
            wordWrap=True,
        )
        self.compare_with = QComboBox(placeholderText="saved traces, once this one ran", minimumContentsLength=24)
        self.diff_button = QPushButton("Diff with this run", clicked=self.show_diff, enabled=False)
        grid = QGridLayout()
        for row, (label, widget, browse) in enumerate(
            (
                ("Script", self.script, self._pick_script),
                ("Arguments", self.args, None),
                ("Working directory", self.cwd, self._pick_cwd),
                ("Target", self.target, None),
            )
        ):
            grid.addWidget(QLabel(label), row, 0)
            grid.addWidget(widget, row, 1)
            if browse is not None:
                grid.addWidget(QPushButton("Browse…", clicked=browse), row, 2)
        buttons = QHBoxLayout()
        for w in (
            self.run_button,
            self.diagnose_button,
            self.stop_button,
            QLabel("Compare with", buddy=self.compare_with),
            self.compare_with,
            self.diff_button,
        ):
            buttons.addWidget(w)
        layout = QVBoxLayout(self)
        layout.addLayout(grid)
        layout.addLayout(buttons)
        layout.addWidget(self.status)
        layout.addWidget(self.output, 1)
        self.resize(820, 560)

    def _pick_script(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Script to trace", self.cwd.text(), "Python (*.py)")
        if path:
            self.script.setText(path)

    def _pick_cwd(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Working directory", self.cwd.text())
        if path:
            self.cwd.setText(path)

    def request(self) -> ScriptTraceRequest:
        return ScriptTraceRequest(
            self.script.text().strip(),
            self.args.text(),
            self.cwd.text().strip(),
            self.target.currentData(),
            self.db_url,
        )

    def run(self, diagnose: bool = False) -> None:
        if not self.script.text().strip():
            self.status.setText("choose a script first")
            return
        self.output.clear()
        self.run_button.setEnabled(False)
        self.diagnose_button.setEnabled(False)
        self.stop_button.setEnabled(True)
        self._t0 = time.monotonic()
        self._timer.start()
        self.job.start(self.request(), diagnose=diagnose)

    def _tick(self) -> None:
        self.status.setText(f"running under the tracer… {time.monotonic() - self._t0:.0f} s")

    def _append(self, text: str) -> None:
        self.output.moveCursor(QTextCursor.End)
        self.output.insertPlainText(text)
        self.output.ensureCursorVisible()

    def _done(self) -> None:
        self._timer.stop()
        self.run_button.setEnabled(True)
        self.diagnose_button.setEnabled(True)
        self.stop_button.setEnabled(False)

    def _on_failed(self, message: str) -> None:
        self._done()
        self.status.setText(f"trace failed: {message}")

    def _on_finished(self, result: dict) -> None:
        self._done()
        report = result["report"]
        self.last_run = result["run_name"]
        saved = f"; saved as run {result['run_id']} ({self.last_run})" if self.last_run else ""
        self.status.setText(
            f"exit code {result['exit_code']}: {report['tokens']} steps, {report['ops']:,} ops, "
            f"{len(report['findings'])} finding(s){saved}. The report is in the Trace panel."
        )
        self._fill_runs()
        self.report_ready.emit(result)

    def _on_diagnosed(self, lines: list) -> None:
        """The diagnosis is already in the output box (the child's stdout); its headline goes up top."""
        self._done()
        self.diagnosis = list(lines)
        self.status.setText(lines[0] if lines else "the diagnosis printed nothing")

    def _fill_runs(self) -> None:
        from opscope.engine import EngineError, RunStore

        try:
            with RunStore.open(self.db_url) as store:
                runs = [r for r in store.list(kind="trace", limit=50) if r.name != self.last_run]
        except (EngineError, OSError) as e:
            self.status.setText(f"{self.status.text()} (cannot list the saved traces: {e})")
            return
        self.compare_with.clear()
        for r in runs:
            self.compare_with.addItem(f"{r.name} ({r.created_at:%Y-%m-%d %H:%M})", r.name)
        self.diff_button.setEnabled(bool(runs) and self.last_run is not None)

    def diff_text(self, other: str) -> str:
        """The diff of ``other`` (A, before) against the run just traced (B, after)."""
        from opscope.engine import trace_runs as runs

        (name_a, a), (name_b, b) = runs.load_summaries([other, self.last_run], self.db_url)
        return runs.render_diff(runs.diff(a, b), name_a, name_b)

    def show_diff(self) -> None:
        other = self.compare_with.currentData()
        if other and self.last_run:
            from opscope.engine import EngineError

            try:
                self.output.setPlainText(self.diff_text(other))
            except (EngineError, OSError) as e:
                self.status.setText(f"cannot compare with {other}: {e}")
