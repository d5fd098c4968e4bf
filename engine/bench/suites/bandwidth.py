"""bandwidth: a large device-to-device copy, GB/s counting bytes read plus bytes written.

Buffers are far larger than the last-level cache so the figure is memory bandwidth, not cache.
The best median is this device's measured bandwidth peak, cached for MBU elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

from opscope.engine.bench.ceilings import peaks
from opscope.engine.bench.measure.options import BenchOptions, SuitePlan, check_torch_device, free_memory_bytes
from opscope.engine.bench.measure.params import param
from opscope.engine.bench.measure.runner import Point, PointOutcome, skipped_point
from opscope.engine.core.results import Metric

NAME = "bandwidth"
DESCRIPTION = "large device copy, GB/s (read + write), the MBU peak"
MIB = 2**20


@dataclass(frozen=True)
class Params:
    sizes_bytes: tuple[int, ...] = param(
        (256 * MIB, 1024 * MIB),
        "Copy sizes",
        "bytes",
        "Bytes copied per point (the rate counts read + write); sizes larger than the caches measure memory.",
    )


QUICK = Params(sizes_bytes=(64 * MIB,))


def make_point(n_bytes: int, device: str) -> Point:
    def prepare():
        import torch

        src = torch.ones(n_bytes // 4, dtype=torch.float32, device=device)
        dst = torch.empty_like(src)
        return lambda: dst.copy_(src)

    moved = 2.0 * (n_bytes // 4 * 4)  # one read and one write of every byte
    return Point(
        f"copy_{n_bytes // MIB}MiB",
        "GB/s",
        prepare,
        value=lambda s: moved / s / 1e9,
        params={"bytes": n_bytes, "bytes_moved_per_copy": moved},
        device=device,
        max_inner=100,
    )


def _points(p: Params, device: str):
    for n in p.sizes_bytes:
        free = free_memory_bytes(device)
        if 2 * n > 0.5 * free:
            yield skipped_point(
                f"copy_{n // MIB}MiB",
                "GB/s",
                f"needs {2 * n / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free",
                {"bytes": n},
            )
        else:
            yield make_point(n, device)


def _finish(device: str, quick: bool, settings: dict, load):
    def finish(outcomes: list[PointOutcome]) -> list[Metric]:
        """The fastest repetition is the measured peak when this run may set one (engine.bench.peaks:
        not --quick, whose buffer may sit partly in cache; no other process busy)."""
        other = load.cores()
        done = [(max(o.metrics[0].samples), o.point.name) for o in outcomes if o.ok and o.metrics[0].samples]
        if done:
            best = max(done)
            settings["peak_record"] = peaks.record_measured(
                device,
                "bandwidth",
                None,
                best[0] * 1e9,
                f"bandwidth suite, {best[1]}, fastest repetition",
                quick=quick,
                other_cores=other,
            )
        return []

    return finish


def plan(opts: BenchOptions, params: Params | None = None) -> SuitePlan:
    check_torch_device(opts.device)
    p = params or (QUICK if opts.quick else Params())
    settings = {"sizes_bytes": list(p.sizes_bytes), "counting": "read + write"}
    return SuitePlan(
        points=_points(p, opts.device),
        n_points=len(p.sizes_bytes),
        settings=settings,
        finish=_finish(opts.device, opts.quick, settings, peaks.load_probe()),
    )
