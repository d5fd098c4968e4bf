"""The Trace panel's model: runs a trace in the engine worker and holds its report and ops."""

from __future__ import annotations

import shutil

from opscope.app.trace.ops_model import OpTableModel
from opscope.app.ui.engine_client import EngineClient, Job
from opscope.app.worker.protocol import TraceRequest
from PySide6.QtCore import QObject, Signal


class TraceModel(QObject):
    started = Signal()
    progress = Signal(int, int)  # op rows received, total
    finished = Signal(dict)  # the placement report (engine.trace.report.PlacementReport.as_dict)
    failed = Signal(str)

    def __init__(self, client: EngineClient, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.client = client
        self.ops = OpTableModel(self)
        self.report: dict | None = None
        self.result: dict | None = None
        self.job: Job | None = None

    @property
    def busy(self) -> bool:
        return self.job is not None

    def run(self, request: TraceRequest) -> Job | None:
        if self.busy:
            return None
        self.ops.clear()
        self.job = self.client.submit(request)
        self.job.batch.connect(self._on_batch)
        self.job.finished.connect(self._on_finished)
        self.job.failed.connect(self._on_failed)
        self.started.emit()
        return self.job

    def _on_batch(self, msg: dict) -> None:
        self.ops.add_batch(msg["columns"])
        self.progress.emit(msg["done"], msg["total"])

    def _on_finished(self, result: dict) -> None:
        self.job = None
        self.ops.commit()
        self.result, self.report = result, result["report"]
        self.finished.emit(self.report)

    def _on_failed(self, _error_type: str, message: str) -> None:
        self.job = None
        self.ops.commit()
        self.failed.emit(message)

    def export_perfetto(self, path: str) -> str:
        """Copy the worker's Perfetto JSON (Trace Event Format) to ``path``."""
        if not self.result:
            raise ValueError("no trace to export yet")
        shutil.copyfile(self.result["perfetto_path"], path)
        return path
