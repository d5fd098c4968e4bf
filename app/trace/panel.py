"""The Trace panel: run a trace, read the placement report as cards and findings, filter the ops."""

from __future__ import annotations

import html

import numpy as np
from opscope.app.trace.model import TraceModel
from opscope.app.trace.ops_model import COLUMNS as OP_COLUMNS
from opscope.app.trace.ops_model import ELASTIC, HIDDEN_BY_DEFAULT
from opscope.app.trace.timeline import TraceTimeline
from opscope.app.ui.notify import export_guard
from opscope.app.ui.tables import keep_in_view, refit
from opscope.app.ui.widgets import shrinkable
from opscope.app.worker.protocol import DiagnoseRequest, TraceRequest
from PySide6.QtCore import QItemSelectionModel, Qt, QTimer
from PySide6.QtGui import QAction
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QFrame,
    QGridLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPlainTextEdit,
    QPushButton,
    QSizePolicy,
    QSpinBox,
    QSplitter,
    QTableView,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

SIMULATE = (("as loaded (its own device)", ""), ("simulated accelerator (meta)", "meta"))
SEVERITY_MARK = {"high": "●", "medium": "◐", "low": "○"}
DIAGNOSE_TIP = (
    "why is it slow: the bound, the culprit line, the fix and the gain "
    "(a short measurement of the loaded model, as `opscope diagnose`)"
)
STOP_TIP = "stop the diagnosis at its next step; nothing of it is saved"
NO_TRACE_YET = "No trace yet: press Trace to record a short generation, or Trace a script…"
MIN_FINDING_ROWS = 4  # the findings list shows at least this many one-line rows at 1400x900
CARD_TITLES = (
    ("on_target", "compute ops on target"),
    ("time_on_target", "compute time on target"),
    ("fallbacks", "fallback ops"),
    ("transfers", "transfers / token"),
    ("syncs", "syncs / token"),
    ("storms", "storms"),
)
# A plugin backend's trace (MLX) has no torch placement to grade: its cards say what its op stream shows.
BACKEND_CARD_TITLES = {
    "on_target": "ops / token",
    "time_on_target": "host time in syncs",
    "fallbacks": "devices / streams",
    "transfers": "host ms / token",
    "syncs": "syncs / token",
    "storms": "distinct ops",
}
BACKEND_EMPTY = ("direction", "module")  # a backend's ops have no copy direction, no torch module
# Below this width the findings go above the op table (_arrange): beside them (~330 px) the table
# needs ~780 px for whole op names (the dock is ~790 px in a 1280 px window, 845 px at 1400x900).
NARROW_PX = 1110


class Card(QFrame):
    def __init__(self, title: str, parent: QWidget | None = None) -> None:
        super().__init__(parent, objectName="card")
        self.value = QLabel("–", objectName="cardValue")
        self.title = QLabel(title, objectName="cardTitle", wordWrap=True)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 6, 10, 6)
        layout.addWidget(self.value)
        layout.addWidget(self.title)

    def set(self, text: str, severity: str = "") -> None:
        self.value.setText(text)
        self.setProperty("severity", severity)
        self.style().unpolish(self)
        self.style().polish(self)


class TracePanel(QWidget):
    def __init__(self, model: TraceModel, variants: list[str] | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.model = model
        self._build_controls(variants or ["clean", "leaky-norm", "per-element-copy"])
        self._build_cards()
        self.findings = _findings_list()
        self.finding_detail = QTextBrowser()
        self.table = QTableView(sortingEnabled=False)
        self.table.setModel(model.ops)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.Interactive)
        self.table.verticalHeader().setDefaultSectionSize(20)  # uniform rows: Qt skips measuring them
        self.table.verticalHeader().setVisible(False)
        self._fit_op_columns()
        self._backend_columns = False  # the empty columns of a backend trace are hidden (_fit_columns_to)
        self.timeline = TraceTimeline()
        self._build_layout()
        model.started.connect(self._on_started)
        model.progress.connect(lambda done, total: self.status.setText(f"receiving ops {done:,}/{total:,}…"))
        model.finished.connect(self.show_report)
        model.failed.connect(self._on_failed)
        self._connect_diagnose()
        self.findings.currentRowChanged.connect(self.select_finding)
        self.table.setSelectionBehavior(QTableView.SelectRows)
        self.table.setSelectionMode(QTableView.SingleSelection)
        self.table.selectionModel().currentRowChanged.connect(lambda index, _prev: self._on_row(index.row()))
        self.timeline.opClicked.connect(self.select_op)
        self._show_empty()

    # -- construction ---------------------------------------------------------------------------
    def _build_controls(self, variants: list[str]) -> None:
        self.prompt = QLineEdit("The capital of France is")
        self.tokens = QSpinBox(minimum=1, maximum=256, value=8)
        self.variant = QComboBox()
        self.variant.addItems(variants)
        self.target = QComboBox()
        for label, value in SIMULATE:
            self.target.addItem(label, value)
        self.run_button = QPushButton("Trace", objectName="primary", clicked=self.run)
        self.export_button = QPushButton("Export Perfetto JSON…", clicked=self.export_dialog, enabled=False)
        self.script_button = QPushButton("Trace a script…", clicked=self.open_script_dialog)
        self.script_dialog = None
        self.diagnose_button = QPushButton("Diagnose", clicked=self.diagnose_or_stop, toolTip=DIAGNOSE_TIP)
        self.diagnosis = QPlainTextEdit(readOnly=True, objectName="diagnosis", visible=False)
        self.diagnosis.setLineWrapMode(QPlainTextEdit.WidgetWidth)
        # ~10 lines, as the CLI prints them; longer ones scroll rather than squeeze the findings and ops
        self.diagnosis.setMaximumHeight(self.diagnosis.fontMetrics().lineSpacing() * 11)
        for combo in (self.variant, self.target):  # a long choice elides instead of widening the window
            combo.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
            combo.setMinimumContentsLength(10)
        shrinkable(self.run_button, self.export_button, self.script_button, self.diagnose_button)
        self.status = QLabel(
            "Trace records every tensor op of a short generation with its device.",
            objectName="statsLine",
            wordWrap=True,
        )
        self.status.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)

    def _build_cards(self) -> None:
        self.cards = {key: Card(title) for key, title in CARD_TITLES}

    def _build_layout(self) -> None:
        cards = QGridLayout()
        for i, card in enumerate(self.cards.values()):
            cards.addWidget(card, 0, i)
        listing = QWidget()
        col = QVBoxLayout(listing)
        col.setContentsMargins(0, 0, 0, 0)
        col.addWidget(QLabel("Findings — click one to see its ops", buddy=self.findings))
        col.addWidget(self.findings, 1)
        findings = QSplitter(Qt.Vertical, childrenCollapsible=False)
        findings.addWidget(listing)
        findings.addWidget(self.finding_detail)
        findings.setSizes([200, 180])
        top = QSplitter(Qt.Horizontal, childrenCollapsible=False)
        top.addWidget(findings)
        top.addWidget(self._table_box())
        top.setStretchFactor(1, 2)
        body = QSplitter(Qt.Vertical)
        body.addWidget(top)
        body.addWidget(self.timeline)
        body.setStretchFactor(0, 3)
        body.setSizes([560, 200])
        top.setSizes([330, 800])  # the op table gets the room: its names elide less
        self._top, self._findings_split, self._narrow = top, findings, False
        layout = QVBoxLayout(self)
        layout.addLayout(self._controls_layout())
        layout.addWidget(self.status)
        layout.addWidget(self.diagnosis)
        layout.addLayout(cards)
        layout.addWidget(body, 1)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._arrange(self.width() < NARROW_PX)

    def _arrange(self, narrow: bool) -> None:
        """Narrow (the Trace dock of a 1280 px window): the findings go above the op table, their
        list beside their detail, so the table has the full width and its op and module names are
        not cut to "pow.Tenso…" and "layer…"; wide: the findings beside the table."""
        if narrow == self._narrow:
            return
        self._narrow = narrow
        self._top.setOrientation(Qt.Vertical if narrow else Qt.Horizontal)
        self._findings_split.setOrientation(Qt.Horizontal if narrow else Qt.Vertical)
        self._findings_split.setSizes([420, 380] if narrow else [200, 180])
        # once the splitter has its new size (the layout runs after this resize event): narrow, a
        # third of its height for the findings, so several wrapped titles show whole
        QTimer.singleShot(0, self._size_top)
        refit(self.table)

    def _size_top(self) -> None:
        total = sum(self._top.sizes())
        self._top.setSizes([total // 3, total - total // 3] if self._narrow else [330, 800])

    def _controls_layout(self) -> QGridLayout:
        controls = QGridLayout()
        controls.addWidget(QLabel("Prompt"), 0, 0)
        controls.addWidget(self.prompt, 0, 1, 1, 3)
        controls.addWidget(QLabel("Tokens"), 0, 4)
        controls.addWidget(self.tokens, 0, 5)
        controls.addWidget(self.run_button, 0, 6)
        for col, (label, widget) in enumerate((("Variant", self.variant), ("Target", self.target))):
            controls.addWidget(QLabel(label), 1, 2 * col)
            controls.addWidget(widget, 1, 2 * col + 1)
        controls.addWidget(self.export_button, 1, 5, 1, 2)
        controls.addWidget(self.script_button, 0, 7)
        controls.addWidget(self.diagnose_button, 1, 7)
        controls.setColumnStretch(1, 1)
        controls.setColumnStretch(3, 2)
        return controls

    def _table_box(self) -> QWidget:
        self.device_filter, self.kind_filter = QComboBox(), QComboBox()
        self.module_filter = QLineEdit(placeholderText="text or glob")
        self.op_filter = QLineEdit(placeholderText="text or glob")
        for widget in (self.device_filter, self.kind_filter):
            widget.currentIndexChanged.connect(lambda _i: self.apply_filters())
        for widget in (self.module_filter, self.op_filter):
            widget.editingFinished.connect(self.apply_filters)
        for combo in (self.device_filter, self.kind_filter):
            combo.setSizeAdjustPolicy(QComboBox.AdjustToContents)  # "all devices" never cut to "all devic"
        self.count_label = QLabel("", objectName="statsLine")
        self.count_label.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        self.filter_labels: dict[str, QLabel] = {}
        row = QGridLayout()
        for i, (text, widget) in enumerate(
            (
                ("Device", self.device_filter),
                ("Module", self.module_filter),
                ("Class", self.kind_filter),
                ("Op", self.op_filter),
            )
        ):
            self.filter_labels[text] = QLabel(text, buddy=widget)
            row.addWidget(self.filter_labels[text], i // 2, 2 * (i % 2))
            row.addWidget(widget, i // 2, 2 * (i % 2) + 1)
        row.addWidget(self.count_label, 0, 4, 2, 1)
        row.setColumnStretch(3, 1)
        row.setColumnStretch(4, 1)
        box = QWidget()
        col = QVBoxLayout(box)
        col.setContentsMargins(0, 0, 0, 0)
        col.addLayout(row)
        col.addWidget(self.table, 1)
        return box

    def _fit_op_columns(self) -> None:
        """The op table fits the panel at 1400x900: the rarely needed columns start hidden (the
        header's context menu shows them again, the hover text of a row lists them all), and long
        op and module names end in "…" rather than push the numbers out of view."""
        header = self.table.horizontalHeader()
        for i, (key, _header, _fmt) in enumerate(OP_COLUMNS):
            self.table.setColumnHidden(i, key in HIDDEN_BY_DEFAULT)
        header.setContextMenuPolicy(Qt.ActionsContextMenu)
        header.setToolTip("Right-click to show or hide columns; hover a row for all of its fields")
        for i, (key, title, _fmt) in enumerate(OP_COLUMNS):
            action = QAction(title, header, checkable=True, checked=key not in HIDDEN_BY_DEFAULT)
            action.toggled.connect(lambda on, col=i: self._show_column(col, on))
            header.addAction(action)
        keep_in_view(self.table, elastic=[i for i, (k, _h, _f) in enumerate(OP_COLUMNS) if k in ELASTIC])

    def _fit_columns_to(self, backend: bool) -> None:
        """While a backend's trace (MLX) shows, its always-empty columns are hidden so that the op
        names are not cut to "array.g…"; a torch trace after it gets them back (through the header
        menu's actions, which stay in step)."""
        if backend == self._backend_columns:
            return
        self._backend_columns = backend
        actions = self.table.horizontalHeader().actions()
        for i, (key, _h, _f) in enumerate(OP_COLUMNS):
            if key in BACKEND_EMPTY:
                actions[i].setChecked(not backend)

    def _show_column(self, col: int, shown: bool) -> None:
        self.table.setColumnHidden(col, not shown)
        refit(self.table)

    # -- actions --------------------------------------------------------------------------------
    def request(self) -> TraceRequest:
        return TraceRequest(
            prompt=self.prompt.text(),
            tokens=self.tokens.value(),
            variant=self.variant.currentText(),
            simulate=self.target.currentData(),
            db_url=getattr(self.window(), "db_url", None),
        )

    def run(self) -> None:
        self.model.run(self.request())

    def _connect_diagnose(self) -> None:
        from opscope.app.trace.diagnose import DiagnoseModel

        self.diagnose_model = m = DiagnoseModel(self.model.client, self)
        m.started.connect(lambda: self._diagnosing("diagnosing the loaded model…"))
        m.stage.connect(lambda stage: self.status.setText(f"diagnosing the loaded model: {stage}…"))
        m.finished.connect(self.show_diagnosis)
        m.cancelled.connect(self._diagnosis_cancelled)
        m.failed.connect(lambda message: self._diagnosed(f"diagnose failed: {message}"))

    def diagnose_or_stop(self) -> None:
        """The Diagnose button: Diagnose when idle, Stop while a diagnosis runs."""
        if self.diagnose_model.busy:
            self.diagnose_model.cancel()
            self.diagnose_button.setEnabled(False)  # once: the worker answers at its next step
            self.status.setText("stopping the diagnosis…")
        else:
            self.diagnose()

    def _diagnosing(self, status: str) -> None:
        self.diagnose_button.setText("Stop")
        self.diagnose_button.setToolTip(STOP_TIP)
        self.status.setText(status)

    def _diagnosed(self, status: str) -> None:
        self.diagnose_button.setText("Diagnose")
        self.diagnose_button.setToolTip(DIAGNOSE_TIP)
        self.diagnose_button.setEnabled(True)
        self.status.setText(status)

    def _diagnosis_cancelled(self, message: str) -> None:
        """The worker says "diagnosis cancelled; nothing was saved" (or, stopped while it waited
        for another job, "cancelled before it started"): the last diagnosis shown stays."""
        self._diagnosed(message if message.startswith("diagnosis") else f"diagnosis {message}; nothing was saved")

    def diagnose(self) -> None:
        """Diagnose the model Chat has loaded, with this panel's variant and target."""
        self.diagnose_model.run(
            DiagnoseRequest(
                variant=self.variant.currentText(),
                simulate=self.target.currentData(),
                db_url=getattr(self.window(), "db_url", None),
            )
        )

    def show_diagnosis(self, lines: list) -> None:
        self.diagnosis.setPlainText("\n".join(lines))
        self.diagnosis.setVisible(True)
        self._diagnosed(lines[0] if lines else "no diagnosis")

    def open_script_dialog(self):
        """Trace a user's own script (app/trace/script_dialog.py); its report shows here."""
        if self.script_dialog is None:
            from opscope.app.trace.script_dialog import ScriptTraceDialog

            self.script_dialog = ScriptTraceDialog(getattr(self.window(), "db_url", None), self)
            self.script_dialog.report_ready.connect(self.show_script_report)
        self.script_dialog.show()
        self.script_dialog.raise_()
        return self.script_dialog

    def show_script_report(self, result: dict) -> None:
        """A script's trace from the dialog: its ops, report and Perfetto file, as for the model."""
        self.model.ops.clear()
        self.model.ops.add_batch(result["columns"])
        self.model.ops.commit()
        self.model.result = dict(result, variant="script")
        self.model.report = result["report"]
        self.show_report(result["report"])
        r = result["report"]
        saved = f"; saved as run {result['run_name']}" if result.get("run_name") else ""
        self.status.setText(
            f"{r.get('script', 'script')} on {r['target']}: {r['ops']:,} ops, {r['tokens']} steps "
            f"({r.get('step_source', '')}); {len(r['findings'])} finding(s); exit code "
            f"{result['exit_code']}{saved}."
        )

    def export_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export trace", "trace.perfetto.json", "JSON (*.json)")
        if path:
            with export_guard(self, "export the trace", path):
                self.model.export_perfetto(path)

    def apply_filters(self, sources: tuple[str, ...] = (), modules: tuple[str, ...] = ()) -> None:
        shown = self.model.ops.set_filter(
            device=self.device_filter.currentData() or "",
            kind=self.kind_filter.currentData() or "",
            module=self.module_filter.text().strip(),
            op=self.op_filter.text().strip(),
            sources=sources,
            modules=modules,
        )
        self.count_label.setText(f"{shown:,} of {self.model.ops.total:,} ops")

    def select_finding(self, row: int) -> None:
        """Show a finding's detail and filter the table to its ops."""
        findings = (self.model.report or {}).get("findings", [])
        if not 0 <= row < len(findings):
            self.apply_filters()
            return
        f = findings[row]
        evidence = "<br>".join(html.escape(str(line)) for line in f.get("evidence", {}).get("lines", [])[:6])
        self.finding_detail.setHtml(
            f"<b>{html.escape(f['title'])}</b><br>{evidence}<br><b>Fix:</b> {html.escape(f.get('fix', ''))}"
        )
        self.apply_filters(tuple(f.get("sources", ())), tuple(f.get("modules", ())))
        self.timeline.select(self.model.ops.rows)  # the finding's ops, outlined where they ran

    def _on_row(self, view_row: int) -> None:
        """A table row chosen (click, keys): its op outlined on the timeline, in view."""
        if 0 <= view_row < len(self.model.ops.rows):
            self.timeline.select([int(self.model.ops.rows[view_row])])

    def select_op(self, row: int) -> None:
        """An op clicked on the timeline: its table row selected and scrolled to; filters that
        hide it are cleared first."""
        rows = self.model.ops.rows
        at = int(np.searchsorted(rows, row))
        if at >= len(rows) or rows[at] != row:
            self.findings.blockSignals(True)
            self.findings.setCurrentRow(-1)
            self.findings.blockSignals(False)
            for combo in (self.device_filter, self.kind_filter):
                combo.setCurrentIndex(0)
            self.module_filter.clear()
            self.op_filter.clear()
            self.apply_filters()
            rows = self.model.ops.rows
            at = int(np.searchsorted(rows, row))
        index = self.model.ops.index(at, 1)
        flags = QItemSelectionModel.SelectionFlag
        self.table.selectionModel().setCurrentIndex(index, flags.ClearAndSelect | flags.Rows)
        self.table.scrollTo(index, QTableView.PositionAtCenter)

    # -- results --------------------------------------------------------------------------------
    def _show_empty(self) -> None:
        """Before the first trace every part says what will fill it, never a blank box."""
        item = QListWidgetItem(NO_TRACE_YET)
        item.setFlags(Qt.NoItemFlags)
        self.findings.addItem(item)
        self.finding_detail.setHtml(
            "<i>A finding's evidence (source lines, copies per token) and its fix show here.</i>"
        )
        self._fill_filters()
        self.count_label.setText("no ops yet")

    def _on_started(self) -> None:
        self.run_button.setEnabled(False)
        self.status.setText("tracing… (the model runs under the tracer; a few seconds)")

    def _on_failed(self, message: str) -> None:
        self.run_button.setEnabled(True)
        self.status.setText(f"trace failed: {message}")

    def show_report(self, report: dict) -> None:
        self.run_button.setEnabled(True)
        self.export_button.setEnabled(True)
        self.status.setText(self._summary(report))
        self.status.setToolTip("\n".join(report.get("notes", [])))
        if report.get("backend"):
            self._fill_backend_cards(report)
            self._fill_backend_findings(report)
        else:
            self._fill_cards(report)
            self._fill_findings(report)
        self._fill_filters()
        self.apply_filters()
        self._fit_columns_to(bool(report.get("backend")))
        refit(self.table)  # contents' widths (Qt measures the rows on screen), inside the view
        self.timeline.show_ops(self.model.ops.columns)

    def _summary(self, report: dict) -> str:
        result = self.model.result or {}
        if report.get("backend"):  # a plugin backend's op stream (app/worker/backend_trace.py)
            return (
                f"{report['backend']} backend on {report['target']}: {report['ops']:,} ops, "
                f"{report['tokens']} tokens, {report['syncs_per_token']:.1f} host syncs per token."
            )
        sim = " (simulated)" if result.get("simulated") else ""
        saved = f"; saved as run {result['run_name']}" if result.get("run_name") else ""
        return (
            f"{result.get('variant', '')} model on {report['target']}{sim}: {report['ops']:,} ops, "
            f"{report['tokens']} tokens; {len(report['findings'])} finding(s){saved}."
        )

    def _fill_cards(self, report: dict) -> None:
        for key, title in CARD_TITLES:  # a backend trace before this one retitled them
            self.cards[key].title.setText(title)
            self.cards[key].setToolTip("")
        kinds = report.get("by_kind", {})
        transfers = sum(t["per_token_count"] for t in report.get("transfers", []))
        storms = sum(1 for f in report.get("findings", []) if f["kind"] == "storm")
        fallback_ops = kinds.get("fallback", {}).get("count", 0)
        ops_pct, time_pct, severity = compute_on_target(kinds)
        self.cards["on_target"].set(f"{ops_pct:.1f}%" if ops_pct is not None else "–", severity)
        self.cards["time_on_target"].set(f"{time_pct:.1f}%" if time_pct is not None else "–", severity)
        host = kinds.get("host", {}).get("count", 0)
        for key in ("on_target", "time_on_target"):  # what the share leaves out, on hover
            self.cards[key].setToolTip(
                f"Share of the compute ops (on target, fallback, mixed-device); the {host:,} "
                f"host bookkeeping ops (views, Python data), transfers and syncs have "
                f"cards of their own."
            )
        self.cards["fallbacks"].set(f"{fallback_ops:,}", "bad" if fallback_ops else "good")
        unit = report.get("unit", "token")  # a script's trace reports per step
        self.cards["transfers"].title.setText(f"transfers / {unit}")
        self.cards["syncs"].title.setText(f"syncs / {unit}")
        self.cards["transfers"].set(f"{transfers:.1f}")
        self.cards["syncs"].set(f"{report['syncs_per_token']:.1f}")
        self.cards["storms"].set(str(storms), "bad" if storms else "good")

    def _fill_findings(self, report: dict) -> None:
        self.findings.clear()
        for f in report.get("findings", []):
            item = QListWidgetItem(f"{SEVERITY_MARK.get(f['severity'], '•')} [{f['kind']}] {f['title']}")
            item.setToolTip(f"Fix: {f.get('fix', '')}")
            self.findings.addItem(item)
        if not report.get("findings"):
            item = QListWidgetItem("No findings: every op ran where it should (beyond the engine's needed I/O).")
            item.setFlags(Qt.NoItemFlags)
            self.findings.addItem(item)
        notes = "".join(f"<li>{html.escape(n)}</li>" for n in report.get("notes", []))
        self.finding_detail.setHtml(f"<i>Click a finding to see its evidence, fix and ops.</i><ul>{notes}</ul>")

    def _fill_backend_cards(self, report: dict) -> None:
        """A backend's op stream: how many ops a token costs, where the host waits, on which streams."""
        table, tokens = report.get("ops_by_time", []), max(report["tokens"], 1)
        total_ms = sum(r["ms"] for r in table)
        sync_ms = sum(r["ms"] for r in table if r["sync"])
        values = {
            "on_target": f"{report['ops'] / tokens:,.0f}",
            "time_on_target": f"{100.0 * sync_ms / total_ms:.1f}%" if total_ms > 0 else "–",
            "fallbacks": str(len(report["devices"])),
            "transfers": f"{report['wall_ms'] / tokens:,.0f}",
            "syncs": f"{report['syncs_per_token']:.1f}",
            "storms": str(len({r["op"] for r in table})),
        }
        for key, title in BACKEND_CARD_TITLES.items():
            self.cards[key].title.setText(title)
            self.cards[key].set(values[key])
            self.cards[key].setToolTip("")
        self.cards["fallbacks"].setToolTip("\n".join(report["devices"]))
        self.cards["time_on_target"].setToolTip(
            "Share of the traced host time spent in syncs (eval, item): a lazy backend computes there."
        )

    def _fill_backend_findings(self, report: dict, top: int = 8) -> None:
        """No placement findings to list: the list says why; the detail holds the notes and the
        ops that took the most host time."""
        self.findings.clear()
        item = QListWidgetItem(
            f"No placement findings on the {report['backend']} backend: its trace lists each op "
            f"with its stream, shapes and host time (the op table and timeline)."
        )
        item.setFlags(Qt.NoItemFlags)
        self.findings.addItem(item)
        notes = "".join(f"<li>{html.escape(n)}</li>" for n in report.get("notes", []))
        rows = "".join(
            f"<tr><td>{html.escape(r['op'])}</td><td align=right>{r['count']:,}</td>"
            f"<td align=right>{r['ms']:.1f}</td><td align=right>{r['pct']:.1f}%</td></tr>"
            for r in report.get("ops_by_time", [])[:top]
        )
        self.finding_detail.setHtml(
            f"<b>Ops by host time</b><table><tr><th align=left>op</th><th>count</th><th>ms</th>"
            f"<th>share</th></tr>{rows}</table><ul>{notes}</ul>"
        )

    def _fill_filters(self) -> None:
        for combo, key, label in (
            (self.device_filter, "device", "all devices"),
            (self.kind_filter, "kind", "all classes"),
        ):
            combo.blockSignals(True)
            combo.clear()
            combo.addItem(label, "")
            for value in self.model.ops.distinct(key):
                combo.addItem(value, value)
            combo.blockSignals(False)


def compute_on_target(kinds: dict) -> tuple[float | None, float | None, str]:
    """(% of compute ops on target, % of their time, card severity) from the report's ``by_kind``.

    Host bookkeeping (views, Python data lifted into tensors), transfers and syncs are not compute
    that could run elsewhere: counted in, a CPU-only script read "64.3 % ops on target" in red
    beside "0 fallback ops". Red only when a compute op did run off target."""
    compute = [kinds.get(k, {}) for k in ("on_target", "fallback", "mixed")]
    count = sum(k.get("count", 0) for k in compute)
    ms = sum(k.get("ms", 0.0) for k in compute)
    on = kinds.get("on_target", {})
    ops_pct = 100.0 * on.get("count", 0) / count if count else None
    time_pct = 100.0 * on.get("ms", 0.0) / ms if ms > 0 else ops_pct
    off = count - on.get("count", 0)
    return ops_pct, time_pct, ("bad" if off else "good") if count else ""


def _findings_list() -> QListWidget:
    """Findings wrap onto as many lines as their title needs: a title is never cut at the list's edge."""
    findings = QListWidget(wordWrap=True)
    findings.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
    findings.setTextElideMode(Qt.ElideNone)
    findings.setResizeMode(QListWidget.Adjust)  # re-wrap when the splitter moves
    findings.setMinimumHeight(MIN_FINDING_ROWS * findings.fontMetrics().lineSpacing() + 12)
    return findings
