"""matmul: square GEMM throughput per dtype and size, GFLOP/s and % of the suite's measured peak.

The best median over sizes for each dtype is this device's measured matmul peak: it is cached
(engine.bench.peaks) and is what MFU elsewhere divides by. Sizes stop where memory ends or where
the rate measured at the previous size predicts a call longer than the point budget (float16 on a
CPU without native half math runs at ~1 GFLOP/s: 8192³ would take 20 minutes per call).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Iterator

from engine.bench import peaks
from engine.bench.options import DTYPE_BYTES, BenchOptions, SuitePlan, check_torch_device, free_memory_bytes
from engine.bench.runner import Point, PointOutcome, skipped_point
from engine.results import Metric

NAME = "matmul"
DESCRIPTION = "square matmul GFLOP/s for float32/bfloat16/float16, 128…8192, % of measured peak"
MEMORY_FRACTION = 0.5  # leave room for everything else in the process


@dataclass(frozen=True)
class Params:
    dtypes: tuple[str, ...] = ("float32", "bfloat16", "float16")
    sizes: tuple[int, ...] = (128, 256, 512, 1024, 2048, 4096, 8192)
    call_budget_s: float = 2.0  # skip a size whose single call is predicted to take longer


QUICK = Params(sizes=(128, 256), call_budget_s=0.5)


def point_name(dtype: str, n: int) -> str:
    return f"matmul_{dtype}_{n}"


def make_point(n: int, dtype: str, device: str) -> Point:
    def prepare():
        import torch

        g = torch.Generator(device="cpu").manual_seed(n)
        a = torch.randn(n, n, generator=g).to(device=device, dtype=getattr(torch, dtype))
        b = torch.randn(n, n, generator=g).to(device=device, dtype=getattr(torch, dtype))
        c = torch.empty_like(a)
        return lambda: torch.matmul(a, b, out=c)

    flop = 2.0 * n ** 3
    return Point(point_name(dtype, n), "GFLOP/s", prepare, value=lambda s: flop / s / 1e9,
                 params={"n": n, "dtype": dtype},
                 device=device, max_inner=1000)


def _rate(outcomes: list[PointOutcome], dtype: str) -> tuple[int, float] | None:
    """(size, median GFLOP/s) of the largest finished size of ``dtype``, if any."""
    done = [(o.point.params["n"], statistics.median(o.metrics[0].samples)) for o in outcomes
            if o.ok and o.point.params.get("dtype") == dtype and o.metrics[0].samples]
    return max(done) if done else None


def _points(p: Params, device: str, outcomes: list[PointOutcome]) -> Iterator[Point]:
    for dtype in p.dtypes:
        for n in p.sizes:
            params = {"n": n, "dtype": dtype}
            need = 3 * n * n * DTYPE_BYTES[dtype]
            free = free_memory_bytes(device)
            rate = _rate(outcomes, dtype)
            call_s = 2.0 * n ** 3 / (rate[1] * 1e9) if rate else 0.0
            if need > MEMORY_FRACTION * free:
                yield skipped_point(point_name(dtype, n), "GFLOP/s",
                                    f"needs {need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free", params)
            elif call_s > p.call_budget_s:
                yield skipped_point(point_name(dtype, n), "GFLOP/s",
                                    f"one call would take ~{call_s:.0f} s at the {rate[1]:.1f} GFLOP/s "
                                    f"measured at n={rate[0]} (budget {p.call_budget_s:g} s)", params)
            else:
                yield make_point(n, dtype, device)


def _finish(device: str, record_peak: bool):
    def finish(outcomes: list[PointOutcome]) -> list[Metric]:
        """% of the measured peak per point; the peak per dtype is cached for MFU elsewhere
        (not from --quick runs: their sizes are too small to reach the peak)."""
        extra: list[Metric] = []
        for dtype in {o.point.params.get("dtype") for o in outcomes if o.ok}:
            best = _best(outcomes, dtype)
            if best is None:
                continue
            if record_peak:
                peaks.record(device, "matmul", dtype, best[1] * 1e9, f"matmul suite, n={best[0]}")
            for o in outcomes:
                m = o.metrics[0]
                if o.ok and o.point.params.get("dtype") == dtype:
                    extra.append(Metric(f"{m.name}.pct_peak", "%", [v / best[1] * 100 for v in m.samples],
                                        True, dict(m.params)))
        return extra
    return finish


def _best(outcomes: list[PointOutcome], dtype: str) -> tuple[int, float] | None:
    meds = [(statistics.median(o.metrics[0].samples), o.point.params["n"]) for o in outcomes
            if o.ok and o.point.params.get("dtype") == dtype and o.metrics[0].samples]
    if not meds:
        return None
    med, n = max(meds)
    return n, med


def plan(opts: BenchOptions, params: Params | None = None) -> SuitePlan:
    check_torch_device(opts.device)
    p = params or (QUICK if opts.quick else Params())
    plan_ = SuitePlan(points=[], n_points=len(p.dtypes) * len(p.sizes),
                      settings={"sizes": list(p.sizes), "dtypes": list(p.dtypes),
                                "call_budget_s": p.call_budget_s, "shape": "n×n @ n×n",
                                "flops_per_call": "2·n³",
                                "pct_peak": "% of the best median GFLOP/s of the same dtype in this run"},
                      finish=_finish(opts.device, record_peak=not opts.quick))
    plan_.points = _points(p, opts.device, plan_.outcomes)
    return plan_
