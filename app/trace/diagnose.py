"""Trace panel → Diagnose: one bounded diagnosis of the model Chat has loaded, run in the engine
worker (app/worker/diagnose.py); its lines, as `opscope diagnose` prints them, for the panel."""

from __future__ import annotations

from opscope.app.ui.engine_client import EngineClient, Job
from opscope.app.worker.protocol import DiagnoseRequest
from PySide6.QtCore import QObject, Signal


class DiagnoseModel(QObject):
    started = Signal()
    stage = Signal(str)  # the measurement's stage that began now ("timing a prefill of 32 tokens…")
    finished = Signal(list)  # the diagnosis's lines
    cancelled = Signal(str)  # the worker's word for it: "diagnosis cancelled; nothing was saved"
    failed = Signal(str)

    def __init__(self, client: EngineClient, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.client = client
        self.job: Job | None = None
        self.result: dict | None = None

    @property
    def busy(self) -> bool:
        return self.job is not None

    def run(self, request: DiagnoseRequest) -> Job | None:
        if self.busy:
            return None
        self.job = self.client.submit(request)
        self.job.progress.connect(self._on_progress)
        self.job.finished.connect(self._on_finished)
        self.job.failed.connect(self._on_failed)
        self.started.emit()
        return self.job

    def cancel(self) -> None:
        """Stop the running diagnosis: the worker ends it at its next stage or decode step."""
        if self.job is not None:
            self.client.stop(self.job)

    def _on_progress(self, msg: dict) -> None:
        if msg.get("stage"):
            self.stage.emit(msg["stage"])

    def _on_finished(self, result: dict) -> None:
        self.job, self.result = None, result
        lines = list(result["lines"])
        if result.get("run_id") is not None:
            lines.append(f"saved as run {result['run_id']} ({result.get('run_name', '')})")
        self.finished.emit(lines)

    def _on_failed(self, error_type: str, message: str) -> None:
        self.job = None
        (self.cancelled if error_type == "Cancelled" else self.failed).emit(message)
