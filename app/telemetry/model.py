"""The Telemetry panel's model: a Sampler in the GUI process plus the engine's phase markers.

The sampler runs here, not in the worker, so that telemetry keeps flowing while the engine is
busy, hung or restarting; the worker's RSS and CPU come from EngineProcessSource, which follows
the worker's pid. Markers arrive from the worker over the protocol, timestamped on the same
monotonic clock (CLOCK_MONOTONIC is system-wide), so bands line up with the samples.
"""

from __future__ import annotations

import collections
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from opscope.app.telemetry.source import EngineProcessSource
from opscope.app.ui import qt_compat  # noqa: F401  (must run before any emit)
from opscope.engine import Marker, Sampler, TelemetrySeries, default_sources, now_ns, write_csv
from PySide6.QtCore import QObject, Signal

GPU_ENTITY = re.compile(r"^((?:gpu|amd)\d+)\.")
MAX_PHASES = 20_000  # bench_iter marks every repetition; older bands fall off the end


@dataclass
class Phase:
    phase: str
    start_ns: int
    end_ns: int | None = None  # None while the phase is still running
    attrs: dict = field(default_factory=dict)


class TelemetryModel(QObject):
    phasesChanged = Signal()

    def __init__(
        self,
        client=None,
        *,
        interval_ms: float = 100.0,
        history_s: float = 3600.0,
        sources=None,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self.client = client  # the panel follows its state (busy: redraw often; idle: seldom)
        self.engine_source = EngineProcessSource()
        if sources is None:
            sources = [*default_sources(in_process=False), self.engine_source]
        self.sampler = Sampler(sources, interval_ms, history_s=history_s)
        self.phases: collections.deque[Phase] = collections.deque(maxlen=MAX_PHASES)
        self._markers: collections.deque[Marker] = collections.deque(maxlen=2 * MAX_PHASES)
        # GPU sources report the memory of the engine worker, not of this (GUI) process.
        self._gpu_sources = [s for s in sources if callable(getattr(s, "set_pids", None))]
        if client is not None:
            client.workerStarted.connect(self.follow_worker)
            client.marker.connect(self.on_marker)
            client.crashed.connect(lambda _message: self.close_open_phases())
            client.workerStarted.connect(lambda _pid: self.close_open_phases())  # a restart ends the old one's
            self.follow_worker(client.pid)

    def follow_worker(self, pid: int | None) -> None:
        """Per-process series (RSS, CPU, GPU memory) follow the engine worker ``pid`` (None: no worker)."""
        self.engine_source.set_pid(pid)
        for source in self._gpu_sources:
            source.set_pids({pid} if pid else set())

    def start(self) -> None:
        # wait=False: opening NVML can take seconds; the panel discovers series as they appear.
        self.sampler.start(wait=False)

    def stop(self) -> None:
        self.sampler.stop()

    # -- series ---------------------------------------------------------------------------------
    def names(self) -> list[str]:
        return self.sampler.series_names()

    def series(self, name: str, since_ns: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        try:
            return self.sampler.series(name, since_ns)
        except KeyError:
            return np.empty(0, np.int64), np.empty(0)

    def gpu_entities(self) -> list[str]:
        return sorted({m.group(1) for n in self.names() if (m := GPU_ENTITY.match(n))})

    def gpu_reason(self) -> str:
        """Why there are no GPU series (empty when there are)."""
        status = self.sampler.status()
        reasons = [why for name, why in status.items() if name in ("nvml", "amdsmi") and why != "ok"]
        return " · ".join(reasons) or "no GPU reported by NVML or AMD SMI"

    # -- phases ---------------------------------------------------------------------------------
    def on_marker(self, msg: dict) -> None:
        phase, edge, t_ns = msg["phase"], msg["edge"], int(msg["t_ns"])
        self._markers.append(Marker(phase, edge, t_ns, dict(msg.get("attrs") or {})))
        if edge == "start":
            self.phases.append(Phase(phase, t_ns, None, dict(msg.get("attrs") or {})))
        else:
            rank = (msg.get("attrs") or {}).get("rank")  # ranks' phases interleave: close this rank's
            for p in reversed(self.phases):
                if p.phase == phase and p.end_ns is None and p.attrs.get("rank") == rank:
                    p.end_ns = t_ns
                    break
        self.phasesChanged.emit()

    def close_open_phases(self) -> None:
        """A crashed worker never sends its end markers: end its open phases now, or the phase it
        was in (a prefill) shades every plot from then on."""
        t_ns = now_ns()
        for p in self.phases:
            if p.end_ns is None:
                p.end_ns = t_ns
        self.phasesChanged.emit()

    def rank_spans(self, phases: list[Phase]) -> dict[int, list[Phase]]:
        """The phases that carry a rank (several processes on one time axis), by rank."""
        out: dict[int, list[Phase]] = {}
        for p in phases:
            if "rank" in p.attrs:
                out.setdefault(int(p.attrs["rank"]), []).append(p)
        return out

    def phases_between(self, since_ns: int, until_ns: int, limit: int) -> list[Phase]:
        """The last ``limit`` phases that overlap [since_ns, until_ns]."""
        out: list[Phase] = []
        for p in reversed(self.phases):
            end = p.end_ns if p.end_ns is not None else until_ns
            if end >= since_ns and p.start_ns <= until_ns:
                out.append(p)
                if len(out) >= limit:
                    break
            elif p.end_ns is not None and end < since_ns and p.start_ns < since_ns - 3600 * 10**9:
                break  # far older than any window: stop scanning
        return out

    # -- export ---------------------------------------------------------------------------------
    def window(self, since_ns: int) -> tuple[list[TelemetrySeries], list[Marker]]:
        units = self.sampler.units
        series = []
        for name in self.names():
            t, v = self.series(name, since_ns)
            series.append(TelemetrySeries(name, units.get(name, ""), t.tolist(), v.tolist()))
        markers = [m for m in self._markers if m.t_ns >= since_ns]
        return series, markers

    def export_csv(self, path: str | Path, since_ns: int) -> int:
        series, markers = self.window(since_ns)
        return write_csv(path, series, markers)
