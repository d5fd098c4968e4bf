"""The Benchmarks panel's model: runs a suite in the engine worker, which saves every point to the
run store as it lands and the run's telemetry window and phase markers when it ends."""

from __future__ import annotations

import logging
import statistics

from opscope.app.ui.engine_client import EngineClient, Job
from opscope.app.worker.protocol import BenchRequest
from PySide6.QtCore import QObject, Signal

log = logging.getLogger(__name__)


def point_summary(point: dict) -> dict:
    """Median and spread of a finished point's raw samples (what the live chart and table show)."""
    samples = [s for s in point.get("samples", []) if s is not None]
    if not samples:
        return {"median": None, "lo": None, "hi": None, "q1": None, "q3": None, "n": 0}
    q1, _q2, q3 = statistics.quantiles(samples, n=4, method="inclusive") if len(samples) > 1 else (samples[0],) * 3
    return {
        "median": statistics.median(samples),
        "lo": min(samples),
        "hi": max(samples),
        "q1": q1,
        "q3": q3,
        "n": len(samples),
    }


class BenchModel(QObject):
    started = Signal(str)  # suite
    progress = Signal(float, int, object)  # done points (fractional), total, eta_s or None
    point = Signal(dict)  # a finished point (metric dict with raw samples)
    finished = Signal(dict)  # run_id, name, status, error
    failed = Signal(str)
    runSaved = Signal(int)  # run id, once the run is closed in the store

    def __init__(self, client: EngineClient, db_url: str | None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.client, self.db_url = client, db_url
        self.job: Job | None = None
        self.run_id: int | None = None
        self.points: list[dict] = []
        self._history: dict[tuple[str, bool], tuple[float, int] | None] = {}  # (suite, quick) -> last run here

    @property
    def busy(self) -> bool:
        return self.job is not None

    def run(
        self,
        suite: str,
        params: dict,
        *,
        name: str = "",
        tags: list[str] | None = None,
        quick: bool = False,
        ab: str | None = None,
    ) -> Job | None:
        """Runs ``suite``; with ``ab`` (side B's flags, as `opscope bench --ab` takes them) both
        settings interleaved, two runs saved, and the result's "comparison" is B against A."""
        if self.busy:
            return None
        self.points, self.run_id = [], None
        request = BenchRequest(
            suite=suite, params=params, name=name, tags=list(tags or []), db_url=self.db_url, quick=quick, ab=ab
        )
        self.job = self.client.submit(request)
        self.job.progress.connect(self._on_progress)
        self.job.finished.connect(self._on_finished)
        self.job.failed.connect(self._on_failed)
        self.started.emit(suite)
        return self.job

    def last_run_here(self, suite: str, quick: bool) -> tuple[float, int] | None:
        """(seconds, points) of the last run of ``suite`` on this machine with the same quick
        setting, read once from the run store (quick SQLite reads) and again after each run."""
        key = (suite, quick)
        if key not in self._history:
            from opscope.engine import RunStore, last_run_here

            try:
                with RunStore.open(self.db_url) as store:
                    self._history[key] = last_run_here(store, suite, quick)
            except Exception as e:  # an estimate is a bonus: without the store it is a guess
                log.warning("no run history for the estimate: %s", e)
                self._history[key] = None
        return self._history[key]

    def cancel(self) -> None:
        if self.job is not None:
            self.client.stop(self.job)

    def _on_progress(self, msg: dict) -> None:
        if msg.get("run_id") is not None:
            self.run_id = msg["run_id"]
        if "point" in msg:
            self.points.append(msg["point"])
            self.point.emit(msg["point"])
        elif msg.get("total"):
            self.progress.emit(float(msg["done"]), int(msg["total"]), msg.get("eta_s"))

    def _on_finished(self, result: dict) -> None:
        self.job = None
        self._history.clear()  # this run is the last one now
        self.run_id = result.get("run_id", self.run_id)
        self.finished.emit(result)
        if self.run_id is not None:
            self.runSaved.emit(self.run_id)

    def _on_failed(self, error_type: str, message: str) -> None:
        self.job = None
        self._history.clear()
        self.failed.emit(f"{error_type}: {message}" if error_type != "Cancelled" else message)
        if self.run_id is not None:
            self.runSaved.emit(self.run_id)
