"""Cutting series by phase: pairing start/end markers and summarizing each series over a phase.

A phase can be shorter than the sampling period (a 40 ms prefill at 10 Hz), so a summary does not
just average the samples that fall inside it: it treats each series as the piecewise-linear curve
through its samples, evaluated at the phase edges as well. The mean is the time-weighted mean of
that curve, the energy (series in W) its integral; outside the first/last sample the curve holds
the nearest value.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from opscope.engine.core.results import Marker, TelemetrySeries

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SeriesSummary:
    mean: float  # time-weighted over the phase
    max: float
    n_samples: int  # samples strictly inside the phase (0 is possible for short phases)
    energy_j: float | None = None  # only for power series (unit "W")


@dataclass(frozen=True)
class PhaseSummary:
    phase: str
    start_ns: int
    end_ns: int
    attrs: dict[str, Any] = field(default_factory=dict)
    series: dict[str, SeriesSummary] = field(default_factory=dict)

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6

    @property
    def energy_j(self) -> float:
        """Energy of all GPUs over the phase, from their power series; NaN without power data."""
        values = [s.energy_j for s in self.series.values() if s.energy_j is not None and not math.isnan(s.energy_j)]
        return math.fsum(values) if values else math.nan

    def as_dict(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "duration_ms": self.duration_ms,
            "attrs": dict(self.attrs),
            "energy_j": _none_if_nan(self.energy_j),
            "series": {
                name: {
                    "mean": _none_if_nan(s.mean),
                    "max": _none_if_nan(s.max),
                    "n_samples": s.n_samples,
                    "energy_j": _none_if_nan(s.energy_j),
                }
                for name, s in self.series.items()
            },
        }


def pair_phases(markers: Iterable[Marker], end_ns: int) -> list[tuple[str, int, int, dict]]:
    """(phase, start_ns, end_ns, attrs) for each start/end pair, in start order. Same-name phases
    nest (last started, first ended); a phase still open at ``end_ns`` is closed there and gets
    ``attrs["open"] = True``; an end without a start is ignored."""
    open_: dict[str, list[Marker]] = {}
    pairs: list[tuple[str, int, int, dict]] = []
    for m in sorted(markers, key=lambda m: m.t_ns):
        if m.edge == "start":
            open_.setdefault(m.phase, []).append(m)
        elif open_.get(m.phase):
            start = open_[m.phase].pop()
            pairs.append((m.phase, start.t_ns, m.t_ns, {**start.attrs, **m.attrs}))
        else:
            log.debug("phase end without start: %s at %d", m.phase, m.t_ns)
    for stack in open_.values():
        pairs += [(s.phase, s.t_ns, end_ns, {**s.attrs, "open": True}) for s in stack]
    return sorted(pairs, key=lambda p: p[1])


def summarize(
    series: Iterable[TelemetrySeries], phase: str, start_ns: int, end_ns: int, attrs: dict | None = None
) -> PhaseSummary:
    out = {
        s.name: summarize_series(
            np.asarray(s.t_ns, dtype=np.int64),
            np.asarray(s.values, dtype=np.float64),
            start_ns,
            end_ns,
            power=s.unit == "W",
        )
        for s in series
    }
    return PhaseSummary(phase, start_ns, end_ns, dict(attrs or {}), out)


def summarize_series(
    t_ns: np.ndarray, values: np.ndarray, start_ns: int, end_ns: int, power: bool = False
) -> SeriesSummary:
    finite = np.isfinite(values)
    t, v = t_ns[finite], values[finite]
    if not len(t):
        return SeriesSummary(math.nan, math.nan, 0, math.nan if power else None)
    inside = (t > start_ns) & (t < end_ns)
    # The curve on [start, end]: edge values interpolated, interior samples as they are.
    ct = np.concatenate([[start_ns], t[inside], [end_ns]]).astype(np.float64)
    cv = np.concatenate([np.interp([start_ns], t, v), v[inside], np.interp([end_ns], t, v)])
    area = _trapezoid(cv, ct)  # value × ns
    duration_ns = end_ns - start_ns
    mean = area / duration_ns if duration_ns > 0 else float(cv[0])
    energy = area / 1e9 if power else None  # W × ns → J
    return SeriesSummary(float(mean), float(cv.max()), int(inside.sum()), energy)


def _trapezoid(y: np.ndarray, x: np.ndarray) -> float:
    return float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2.0))


def _none_if_nan(x: float | None) -> float | None:
    return None if x is None or math.isnan(x) else x
