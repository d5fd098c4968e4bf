"""matmul: square GEMM throughput per dtype and size, GFLOP/s and % of the device's peaks.

Each point gets ``.pct_peak`` (of the theoretical peak) and ``.pct_peak_measured`` (of the measured
peak), as engine.bench.utilisation defines them. The fastest repetition of the best size per
dtype is this device's measured matmul peak when the run may set one (engine.bench.peaks: a full
run, no other process busy on the CPU, better than the stored one); it is what MFU elsewhere
divides by. Sizes stop where memory ends or where
the rate measured at the previous size predicts a call longer than the point budget (float16 on a
CPU without native half math runs at ~1 GFLOP/s: 8192³ would take 20 minutes per call).
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Iterator
from dataclasses import dataclass

from opscope.engine.bench.ceilings import peaks, utilisation
from opscope.engine.bench.measure.options import (
    DTYPE_BYTES,
    BenchOptions,
    SuitePlan,
    check_torch_device,
    free_memory_bytes,
)
from opscope.engine.bench.measure.params import param
from opscope.engine.bench.measure.runner import Point, PointOutcome, skipped_point
from opscope.engine.core.errors import ConfigError
from opscope.engine.core.results import Metric

log = logging.getLogger(__name__)

NAME = "matmul"
DESCRIPTION = "square matmul GFLOP/s for float32/bfloat16/float16, 128…8192, % of measured peak"
MEMORY_FRACTION = 0.5  # leave room for everything else in the process


@dataclass(frozen=True)
class Params:
    dtypes: tuple[str, ...] = param(
        ("float32", "bfloat16", "float16"),
        "Data types",
        "",
        "Element types measured, each at every size (float32, bfloat16, float16).",
    )
    sizes: tuple[int, ...] = param(
        (128, 256, 512, 1024, 2048, 4096, 8192),
        "Matrix sizes",
        "n×n",
        "Square matrix sizes n: each point multiplies two n×n matrices (2·n³ FLOP).",
    )
    call_budget_s: float = param(
        2.0,
        "Call budget",
        "s",
        "Skip a size whose single call is predicted (from the smaller sizes) to take longer than this.",
    )
    # Every timed call runs the matmul round(10 × this) times while GFLOP/s counts 10.
    planted_slowdown: float = param(
        1.0,
        "Planted slowdown",
        "×",
        "A deliberate regression to check comparisons end to end: 1 = off, 2 halves "
        "the reported rate, 1.1 is 10 % slower.",
    )


QUICK = Params(sizes=(128, 256), call_budget_s=0.5)
PARAM_CHOICES = {"dtypes": tuple(DTYPE_BYTES)}  # checked by engine.bench.params before a run


def point_name(dtype: str, n: int) -> str:
    return f"matmul_{dtype}_{n}"


PLANTED_UNIT = 10  # a planted slowdown's step counts this many matmuls and runs round(factor × it)


def make_point(n: int, dtype: str, device: str, planted_slowdown: float = 1.0) -> Point:
    counted = 1 if planted_slowdown == 1 else PLANTED_UNIT
    calls = 1 if planted_slowdown == 1 else round(PLANTED_UNIT * planted_slowdown)

    def prepare():
        import torch

        g = torch.Generator(device="cpu").manual_seed(n)
        a = torch.randn(n, n, generator=g).to(device=device, dtype=getattr(torch, dtype))
        b = torch.randn(n, n, generator=g).to(device=device, dtype=getattr(torch, dtype))
        c = torch.empty_like(a)
        if planted_slowdown == 1:
            return lambda: torch.matmul(a, b, out=c)

        def slowed():
            for _ in range(calls):
                out = torch.matmul(a, b, out=c)
            return out

        return slowed

    flop = 2.0 * n**3 * counted
    return Point(
        point_name(dtype, n),
        "GFLOP/s",
        prepare,
        value=lambda s: flop / s / 1e9,
        params={"n": n, "dtype": dtype},
        device=device,
        max_inner=1000,
    )


def _rate(outcomes: list[PointOutcome], dtype: str) -> tuple[int, float] | None:
    """(size, median GFLOP/s) of the largest finished size of ``dtype``, if any."""
    done = [
        (o.point.params["n"], statistics.median(o.metrics[0].samples))
        for o in outcomes
        if o.ok and o.point.params.get("dtype") == dtype and o.metrics[0].samples
    ]
    return max(done) if done else None


def _points(p: Params, device: str, outcomes: list[PointOutcome]) -> Iterator[Point]:
    for dtype in p.dtypes:
        for n in p.sizes:
            params = {"n": n, "dtype": dtype}
            need = 3 * n * n * DTYPE_BYTES[dtype]
            free = free_memory_bytes(device)
            rate = _rate(outcomes, dtype)
            call_s = 2.0 * n**3 / (rate[1] * 1e9) if rate else 0.0
            if need > MEMORY_FRACTION * free:
                yield skipped_point(
                    point_name(dtype, n),
                    "GFLOP/s",
                    f"needs {need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free",
                    params,
                )
            elif rate is not None and call_s > p.call_budget_s:
                yield skipped_point(
                    point_name(dtype, n),
                    "GFLOP/s",
                    f"one call would take ~{call_s:.0f} s at the {rate[1]:.1f} GFLOP/s "
                    f"measured at n={rate[0]} (budget {p.call_budget_s:g} s)",
                    params,
                )
            else:
                yield make_point(n, dtype, device, p.planted_slowdown)


def _best(outcomes: list[PointOutcome], dtype: str) -> tuple[int, float] | None:
    """(size, GFLOP/s) of the fastest repetition of ``dtype`` in this run."""
    best = [
        (max(o.metrics[0].samples), o.point.params["n"])
        for o in outcomes
        if o.ok and o.point.params.get("dtype") == dtype and o.metrics[0].samples
    ]
    if not best:
        return None
    value, n = max(best)
    return n, value


def _pct_metrics(outcomes: list[PointOutcome], dtype: str, device: str) -> list[Metric]:
    """% of the theoretical and of the measured peak per point of ``dtype``."""
    pk = {"flop": peaks.peak_set(device, "matmul", dtype)}
    out: list[Metric] = []
    for o in outcomes:
        m = o.metrics[0]
        if not (o.ok and o.point.params.get("dtype") == dtype):
            continue
        for d in utilisation.derived(m.name, "pct_peak", lambda g: g * 1e9, pk, "flop"):
            vals = [d.fn(v) for v in m.samples]
            problem = d.problem(vals)
            out.append(
                Metric(d.name, "%", vals, True, dict(m.params) | dict(d.params), "failed" if problem else "ok", problem)
            )
    return out


def _finish(device: str, quick: bool, planted: bool, settings: dict, load):
    def finish(outcomes: list[PointOutcome]) -> list[Metric]:
        """Records the measured peak per dtype when this run may set it, then % of the peaks."""
        other = load.cores()
        extra: list[Metric] = []
        recorded = settings.setdefault("peak_record", {})
        for dtype in sorted({str(o.point.params["dtype"]) for o in outcomes if o.ok}):
            best = _best(outcomes, dtype)
            if best is None:
                continue
            recorded[dtype] = (
                "not recorded: a planted slowdown's rate is no peak"
                if planted
                else peaks.record_measured(
                    device,
                    "matmul",
                    dtype,
                    best[1] * 1e9,
                    f"matmul suite, n={best[0]}, fastest repetition",
                    quick=quick,
                    other_cores=other,
                )
            )
            log.info("matmul %s peak: %s", dtype, recorded[dtype])
            extra += _pct_metrics(outcomes, dtype, device)
        return extra

    return finish


def plan(opts: BenchOptions, params: Params | None = None) -> SuitePlan:
    check_torch_device(opts.device)
    p = params or (QUICK if opts.quick else Params())
    if p.planted_slowdown < 1:
        raise ConfigError(f"matmul: planted_slowdown must be at least 1, got {p.planted_slowdown}")
    settings = {
        "sizes": list(p.sizes),
        "dtypes": list(p.dtypes),
        "call_budget_s": p.call_budget_s,
        "shape": "n×n @ n×n",
        "flops_per_call": "2·n³",
        "planted_slowdown": p.planted_slowdown,
        "pct_peak": "% of the theoretical peak; pct_peak_measured: % of the measured peak",
        "peaks": {dt: peaks.peak_set(opts.device, "matmul", dt) for dt in p.dtypes},
    }
    plan_ = SuitePlan(
        points=[],
        n_points=len(p.dtypes) * len(p.sizes),
        settings=settings,
        finish=_finish(opts.device, opts.quick, p.planted_slowdown != 1, settings, peaks.load_probe()),
    )
    plan_.points = _points(p, opts.device, plan_.outcomes)
    return plan_
