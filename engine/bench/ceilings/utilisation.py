"""Utilisation metrics (MFU, MBU, % of peak): one per peak, never shown above 100%.

``<point>.<metric>`` divides by the theoretical peak, ``<point>.<metric>_measured`` by the measured
one (engine.bench.peaks); each carries the peak's label in its params, so every table can say what
the percentage is of. A value above 100% of the measured peak invalidates that peak (it was no
ceiling); above 100% of the theoretical peak shows the theoretical assumption does not hold here.
Either way the metric is failed with the reason, its raw samples kept, and no such number printed.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

from opscope.engine.bench.ceilings import peaks
from opscope.engine.bench.measure.runner import Derived
from opscope.engine.core.results import Metric
from opscope.engine.core.units import format_rate

log = logging.getLogger(__name__)

CEILING_PCT = 100.0
PEAK_PARAMS = ("peak", "peak_value", "peak_basis", "peak_unit", "peak_source")  # which peak, in params
SUFFIXES = (".mfu", ".mbu", ".pct_peak")  # with "_measured" appended for the measured basis
_KINDS = {"flop": "matmul", "bytes": "bandwidth"}


def pct(achieved: float, peak: float | None) -> float:
    return achieved / peak * 100.0 if peak else float("nan")


def _pct_of(achieved: Callable[[float], float], peak: float | None) -> Callable[[float], float]:
    """A primary sample → its percent of ``peak``."""
    return lambda v: pct(achieved(v), peak)


def is_utilisation(name: str) -> bool:
    return name.endswith(SUFFIXES) or name.endswith(tuple(s + "_measured" for s in SUFFIXES))


def unit_label(m: Metric) -> str:
    """The unit column: a utilisation names the peak it divides by ("% of theor. 589 GFLOP/s"; the
    lines under the table say how each peak was obtained)."""
    p = m.params
    if m.unit != "%" or not p.get("peak"):
        return m.unit
    if p.get("peak_value") and p.get("peak_unit"):
        given = p.get("peak_basis")
        basis = {"theoretical": "theor.", "measured": "meas."}.get(given, given) if isinstance(given, str) else given
        return f"% of {basis} {format_rate(p['peak_value'], p['peak_unit'], digits=3)}"
    return f"% of {p['peak']}"


def over_ceiling(m: Metric) -> str | None:
    """Why a stored utilisation metric must not be shown (a sample above 100%), or None: the last
    guard for runs saved before the ceiling rule, and for suites that divide by one peak."""
    top = max((v for v in m.samples if math.isfinite(v)), default=None)
    if not is_utilisation(m.name) or top is None or top <= CEILING_PCT:
        return None
    return "invalid: above 100% of its peak, which is therefore no ceiling"


def over_measured(name: str, peak: peaks.Peak, device: str, theoretical_name: str | None) -> Callable[[float], str]:
    def react(top_pct: float) -> str:
        peaks.invalidate(device, peak.kind, peak.dtype, name, top_pct)
        see = f"; see {theoretical_name} (of the theoretical peak)" if theoretical_name else ""
        reached = format_rate(top_pct / 100 * peak.value, peaks.UNITS[peak.kind])
        return (
            f"invalid: reached {reached}, above the {peak.label} peak, so that peak was no ceiling "
            f"and is now invalidated{see}"
        )

    return react


def over_theoretical(peak: peaks.Peak) -> Callable[[float], str]:
    def react(top_pct: float) -> str:
        reached = format_rate(top_pct / 100 * peak.value, peaks.UNITS[peak.kind])
        log.warning(
            "reached %s, above the theoretical peak (%s): its assumption does not hold here", reached, peak.source
        )
        return (
            f"invalid: reached {reached}, above the {peak.label} peak; its assumption "
            f"({peak.source}) does not hold for this machine"
        )

    return react


def derived(
    point: str, metric: str, achieved: Callable[[float], float], pk: dict[str, Any], which: str
) -> tuple[Derived, ...]:
    """The utilisation metrics of ``point``'s primary value: ``achieved(value)`` FLOP/s or bytes/s
    over the peaks in ``pk`` (engine.bench.peaks.model_peaks), ``which`` "flop" or "bytes"."""
    ps = pk.get(which) or {}
    th, me = peaks.Peak.from_dict(ps.get("theoretical")), peaks.Peak.from_dict(ps.get("measured"))
    out = []
    th_name = f"{point}.{metric}"
    if th is not None:
        out.append(
            Derived(
                th_name,
                "%",
                _pct_of(achieved, th.value),
                th.as_params(),
                limit=CEILING_PCT,
                over_limit=over_theoretical(th),
            )
        )
    if me is not None:
        name = f"{th_name}_measured"
        out.append(
            Derived(
                name,
                "%",
                _pct_of(achieved, me.value),
                me.as_params(),
                limit=CEILING_PCT,
                over_limit=over_measured(name, me, ps.get("device", "cpu"), th_name if th else None),
            )
        )
    return tuple(out)
