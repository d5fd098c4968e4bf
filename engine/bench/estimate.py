"""How long a benchmark run will take, said before it starts: from the suite's points and the
runner's repetitions (the quick 60 s budget where it applies), scaled by the last run of the same
suite on this machine when the run store has one, a guess otherwise.

It never plans the suite (planning loads a model or probes a device); the points are counted from
the parameters as each suite's plan counts them, so a device that skips variants makes it high."""

from __future__ import annotations

import math
import platform
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opscope.engine.bench.measure.runner import QUICK, QUICK_BUDGET_S, RunnerConfig

# Without history: a point is its warm-up, the runner's repetitions (at least min_time_s) and its
# setup; a suite that loads a model adds the load. Seconds, round figures: this is a guess.
SETUP_S_PER_POINT = 2.0
MODEL_LOAD_S = 10.0
HISTORY_RUNS = 5  # the newest runs of the suite looked at for one from this machine


def _n(params: dict, key: str) -> int:
    value = params.get(key)
    return len(value) if isinstance(value, (list, tuple)) else 1


# The points of each suite's plan, from its parameters (the plan's own n_points rule).
_POINTS: dict[str, Callable[[dict], int]] = {
    "llm": lambda p: 2 * _n(p, "depths") + 1,
    "kv-cache": lambda p: 2 * _n(p, "seq_lens"),
    "matmul": lambda p: _n(p, "dtypes") * _n(p, "sizes"),
    "attention": lambda p: 2 * _n(p, "seq_lens"),  # naive and sdpa; a device with more kernels has more
    "crossover": lambda p: 3 * sum(_n(p, k) for k in ("matmul", "attention", "decode")),
    "collectives": lambda p: _n(p, "sizes_bytes") * _n(p, "collectives"),
    "peers": lambda p: _n(p, "peers") + 1,
}


def planned_points(suite: str, params: dict) -> int:
    """The points a run of ``suite`` with ``params`` measures; other suites: one per value of
    their list parameter (sizes, batches, models, variants)."""
    rule = _POINTS.get(suite)
    if rule is not None:
        return max(1, rule(params))
    return max(1, math.prod(len(v) for v in params.values() if isinstance(v, (list, tuple)) and v))


@dataclass(frozen=True)
class RunEstimate:
    seconds: float
    points: int
    last_s: float | None = None  # the last run of the suite on this machine, when there is one
    last_points: int | None = None
    capped: bool = False  # the quick budget bounds it

    @property
    def guess(self) -> bool:
        return self.last_s is None


def estimate_run(
    suite: str, params: dict, quick: bool, *, needs_model: bool = False, last: tuple[float, int] | None = None
) -> RunEstimate:
    """``last``: (seconds, points) of the last run of ``suite`` with the same quick setting here."""
    points = planned_points(suite, params)
    if last is not None and last[1] > 0:
        seconds = last[0] * points / last[1]
    else:
        cfg: RunnerConfig = QUICK if quick else RunnerConfig()
        seconds = points * (cfg.min_time_s + SETUP_S_PER_POINT) + (MODEL_LOAD_S if needs_model else 0.0)
    # The budget covers the measuring; each point is still loaded and measured at least once.
    cap = QUICK_BUDGET_S + points * SETUP_S_PER_POINT if quick else math.inf
    last_s, last_points = last if last is not None else (None, None)
    return RunEstimate(min(seconds, cap), points, last_s, last_points, capped=seconds > cap)


def last_run_here(store: Any, suite: str, quick: bool) -> tuple[float, int] | None:
    """(seconds, points) of the newest completed run of ``suite`` made on this host with the same
    quick setting, from the run store; None when there is none (or it predates stored points)."""
    for info in store.list(kind=suite, status="completed", limit=HISTORY_RUNS):
        if info.duration_s is None:
            continue
        result = store.get(info.id)
        host = (result.fingerprint or {}).get("host", {}).get("hostname")
        points = result.settings.get("planned_points")
        if host == platform.node() and bool(result.settings.get("quick")) == quick and points:
            return info.duration_s, int(points)
    return None


def took_text(seconds: float) -> str:
    """A measured duration, as measured: "2 s", "1.9 min"."""
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def duration_text(seconds: float) -> str:
    """ "about 40 s", "about 2 min", "about 1 h 10 min": a rounded figure, never false precision."""
    if seconds < 55:
        return f"about {max(5, 5 * round(seconds / 5)):.0f} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"about {minutes} min"
    return f"about {minutes // 60} h {minutes % 60} min" if minutes % 60 else f"about {minutes // 60} h"
