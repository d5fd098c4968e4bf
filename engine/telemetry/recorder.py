"""Recorder: one window of telemetry (a generation, a benchmark run) with the engine's phase markers,
ready to attach to a RunResult and to cut into per-phase summaries.

    with Recorder(sampler) as rec:
        for event in model.generate(prompt, config):
            ...
    run.telemetry, run.markers = rec.telemetry(), rec.markers
    for p in rec.phases(): print(p.phase, p.duration_ms, p.energy_j)

The window's samples are read from the sampler's history when asked for, so the window must be
shorter than the history (default one hour); an exact sample is taken at start and at stop.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from opscope.engine.core import markers as engine_markers
from opscope.engine.core.clock import now_ns
from opscope.engine.core.results import Marker, RunResult, TelemetrySeries
from opscope.engine.telemetry.summary import PhaseSummary, pair_phases, summarize

if TYPE_CHECKING:
    from opscope.engine.telemetry.sampler import Sampler

log = logging.getLogger(__name__)


class Recorder:
    def __init__(self, sampler: Sampler | None = None) -> None:
        self.sampler = sampler  # None records markers only
        self.start_ns: int | None = None
        self.end_ns: int | None = None
        self.markers: list[Marker] = []
        self._lock = threading.Lock()
        self._unsubscribe: Callable[[], None] | None = None

    def start(self) -> Recorder:
        if self.sampler is not None and self.sampler.running:
            self.sampler.sample_now()
        self.start_ns = now_ns()
        self._unsubscribe = engine_markers.subscribe(self._on_marker)
        return self

    def stop(self) -> Recorder:
        if self._unsubscribe is None:
            return self
        self._unsubscribe()
        self._unsubscribe = None
        self.end_ns = now_ns()
        if self.sampler is not None and self.sampler.running:
            self.sampler.sample_now()
        return self

    def __enter__(self) -> Recorder:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _on_marker(self, m) -> None:
        # Called inside the generation loop: append only.
        with self._lock:
            self.markers.append(Marker(m.phase, m.edge, m.t_ns, dict(m.attrs)))

    def telemetry(self, names: list[str] | None = None) -> list[TelemetrySeries]:
        """Every sampled series (or ``names``) over the window, including the samples taken at
        start and stop."""
        if self.sampler is None or self.start_ns is None:
            return []
        lo, hi = self.start_ns, self.end_ns if self.end_ns is not None else now_ns()
        oldest = self.sampler.history.oldest_ns()
        if oldest is not None and oldest > lo:
            log.warning(
                "telemetry window starts %.1f s before the oldest kept sample; raise the sampler's history_s",
                (oldest - lo) / 1e9,
            )
        units = self.sampler.units
        out = []
        # One sampling period of margin each side: edge values of a phase interpolate from them.
        margin = self.sampler.period_ns
        for name in names or self.sampler.series_names():
            t, v = self.sampler.series(name, lo - margin, hi + margin)
            out.append(TelemetrySeries(name, units.get(name, ""), t.tolist(), v.tolist()))
        return out

    def phases(self, series: list[TelemetrySeries] | None = None) -> list[PhaseSummary]:
        """One summary per phase occurrence (each BENCH_ITER separately), in start order."""
        series = self.telemetry() if series is None else series
        end = self.end_ns if self.end_ns is not None else now_ns()
        with self._lock:
            pairs = pair_phases(list(self.markers), end)
        return [summarize(series, name, a, b, attrs) for name, a, b, attrs in pairs]

    def attach(self, run: RunResult) -> RunResult:
        """Put this window's series and markers on a run (what engine.store saves)."""
        run.telemetry = self.telemetry()
        with self._lock:
            run.markers = list(self.markers)
        return run
