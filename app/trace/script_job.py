"""Trace a user's script from the window: `opscope trace -- python SCRIPT ARGS` in a child process.

The script runs in its own process (as the engine always does: a crash or a hang in the user's
code must never take the window with it); its output streams here line by line, and when it ends
the report (``--report``), the ops (``--jsonl``) and the Perfetto JSON (``--out``) are read from
a temporary folder. The trace is saved in the run store like any other.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from opscope.app.ui import qt_compat  # noqa: F401  (must run before any emit)
from PySide6.QtCore import QObject, QProcess, QProcessEnvironment, Signal

ROOT = Path(__file__).resolve().parents[2]
_SAVED = re.compile(r"^saved as run (\d+) \((.+)\);")


@dataclass(frozen=True)
class ScriptTraceRequest:
    script: str
    args: str = ""  # as typed: split like a shell would (shlex)
    cwd: str = ""
    target: str = ""  # "" = the engine's default (cuda when available, else cpu)
    db_url: str | None = None

    def argv(self, folder: Path) -> list[str]:
        db = ["--db", self.db_url] if self.db_url else []
        target = ["--target", self.target] if self.target else []
        return [
            "-m",
            "opscope.engine.cli.main",
            *db,
            "trace",
            *target,
            "--report",
            str(folder / "report.json"),
            "--jsonl",
            str(folder / "ops.jsonl"),
            "--out",
            str(folder / "trace.perfetto.json"),
            "--",
            "python",
            self.script,
            *shlex.split(self.args),
        ]

    def diagnose_argv(self) -> list[str]:
        """`opscope diagnose -- python SCRIPT ARGS`: the script's diagnosis, saved as a run."""
        db = ["--db", self.db_url] if self.db_url else []
        target = ["--target", self.target] if self.target else []
        return [
            "-m",
            "opscope.engine.cli.main",
            *db,
            "diagnose",
            *target,
            *(["--cwd", self.cwd] if self.cwd else []),
            "--",
            "python",
            self.script,
            *shlex.split(self.args),
        ]


class ScriptTraceJob(QObject):
    output = Signal(str)  # a piece of the script's (and then the report's) output
    finished = Signal(dict)  # {"report", "columns", "exit_code", "run_id", "run_name", "perfetto_path"}
    diagnosed = Signal(list)  # a diagnosis's lines (start(..., diagnose=True)), as `opscope diagnose` prints them
    failed = Signal(str)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.process: QProcess | None = None
        self._folder: tempfile.TemporaryDirectory | None = None
        self._stdout: list[str] = []
        self._diagnose = False

    @property
    def busy(self) -> bool:
        return self.process is not None

    def start(self, req: ScriptTraceRequest, diagnose: bool = False) -> None:
        if self.busy:
            return
        self._diagnose = diagnose
        self._folder = tempfile.TemporaryDirectory(prefix="opscope-script-trace-")
        self._stdout = []
        proc = self.process = QProcess(self)
        env = QProcessEnvironment.systemEnvironment()
        env.insert("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), env.value("PYTHONPATH")])))
        env.insert("PYTHONUNBUFFERED", "1")  # the script's prints arrive as they happen
        proc.setProcessEnvironment(env)
        proc.setWorkingDirectory(req.cwd or os.getcwd())
        proc.readyReadStandardOutput.connect(lambda: self._read(proc.readAllStandardOutput(), True))
        proc.readyReadStandardError.connect(lambda: self._read(proc.readAllStandardError(), False))
        proc.finished.connect(self._on_finished)
        proc.errorOccurred.connect(self._on_error)
        proc.start(sys.executable, req.diagnose_argv() if diagnose else req.argv(Path(self._folder.name)))

    def cancel(self) -> None:
        if self.process is not None:
            self.process.kill()

    def _read(self, data, is_stdout: bool) -> None:
        text = bytes(data).decode("utf-8", "replace")
        if is_stdout:
            self._stdout.append(text)
        self.output.emit(text)

    def _on_error(self, error) -> None:
        if error == QProcess.FailedToStart:
            self.process = None
            self.failed.emit(f"could not start {sys.executable}: {error}")

    def _on_finished(self, exit_code: int, _status) -> None:
        self.process = None
        if self._diagnose:
            self._on_diagnosed(exit_code)
            return
        folder = Path(self._folder.name)
        report_path = folder / "report.json"
        if not report_path.is_file():
            self.failed.emit(f"the trace ended (exit code {exit_code}) without a report; see the output")
            return
        report = json.loads(report_path.read_text())
        saved = [m for line in "".join(self._stdout).splitlines() if (m := _SAVED.match(line))]
        self.finished.emit(
            {
                "report": report,
                "columns": read_columns(folder / "ops.jsonl"),
                "exit_code": exit_code,
                "run_id": int(saved[-1][1]) if saved else None,
                "run_name": saved[-1][2] if saved else None,
                "perfetto_path": str(folder / "trace.perfetto.json"),
            }
        )

    def _on_diagnosed(self, exit_code: int) -> None:
        lines = "".join(self._stdout).splitlines()
        start = next((i for i, line in enumerate(lines) if _DIAGNOSIS.match(line)), None)
        if start is None:
            self.failed.emit(f"the diagnosis ended (exit code {exit_code}) without a report; see the output")
            return
        self.diagnosed.emit(lines[start + 1 :])


_DIAGNOSIS = re.compile(r"^=+ opscope diagnose: ")


def read_columns(path: Path) -> dict[str, list]:
    """The op table's columns (app.trace.ops_model.COLUMNS) from the trace's JSON lines."""
    cols: dict[str, list] = {
        k: []
        for k in (
            "seq",
            "op",
            "kind",
            "direction",
            "device",
            "module",
            "source",
            "step",
            "t_us",
            "dur_us",
            "bytes",
            "shapes",
        )
    }
    if not path.is_file():
        return cols
    start = 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            if row["type"] == "header":
                start = row["start_ns"]
            elif row["type"] == "op":
                devices = row["out_devices"] or row["in_devices"] or ["cpu"]
                for key, value in (
                    ("seq", row["seq"]),
                    ("op", row["op"]),
                    ("kind", row["kind"]),
                    ("direction", row["direction"] or ""),
                    ("device", devices[0]),
                    ("module", row["module"] or ""),
                    ("source", row["source"] or ""),
                    ("step", row["step"]),
                    ("t_us", (row["t_ns"] - start) / 1e3),
                    ("dur_us", row["dur_ns"] / 1e3),
                    ("bytes", row["bytes_read"] + row["bytes_written"]),
                    ("shapes", " ".join("x".join(map(str, s)) for s in row["in_shapes"])),
                ):
                    cols[key].append(value)
    return cols
