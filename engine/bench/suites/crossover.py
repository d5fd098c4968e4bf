"""crossover: CPU against an accelerator over a sweep of sizes, and the size where the accelerator
starts to win, with the cost of moving the data to it and back included.

For each workload and size three points: the call on the CPU, the call on the accelerator (data
already there), and the transfer (inputs host→device, output device→host, synchronized). The
accelerator's time for a request that starts and ends on the host is call + transfer. Workloads:

- ``matmul`` n: n×n @ n×n, float32 by default (``--dtype``).
- ``attention`` T: causal SDPA, 1 batch × 8 heads × T × 64.
- ``decode`` d: one decode step's MLP of width d: [1, d] @ [d, 4d] → SiLU → @ [4d, d] with the
  weights resident on the device (only the activation row moves, as in real decode).

``<workload>.crossover`` (unit: the workload's size) is the smallest swept size from which the
accelerator (with transfer) is faster at that size and every larger one; no such metric where it
never wins in the sweep (said in ``crossover_note``). Needs two devices: on a machine with only a
CPU the plan stops with one line saying what it would compare.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from opscope.engine.bench.measure.options import BenchOptions, SuitePlan, torch_dtype
from opscope.engine.bench.measure.params import param
from opscope.engine.bench.measure.runner import Point, PointOutcome
from opscope.engine.core.errors import DeviceError
from opscope.engine.core.results import Metric

NAME = "crossover"
DESCRIPTION = "CPU vs GPU over sizes (matmul, attention, a decode step), transfer included: where the GPU wins"
WORKLOADS = ("matmul", "attention", "decode")


@dataclass(frozen=True)
class Params:
    matmul: tuple[int, ...] = param(
        (16, 32, 64, 128, 256, 512, 1024, 2048),
        "Matmul sizes",
        "n×n",
        "Square matmul sizes timed on the CPU and the GPU, transfers included.",
    )
    attention: tuple[int, ...] = param(
        (16, 64, 256, 1024, 2048),
        "Attention lengths",
        "tokens",
        "Sequence lengths of the attention call timed on both devices.",
    )
    decode: tuple[int, ...] = param(
        (64, 256, 576, 1024, 2048, 4096),
        "Decode widths",
        "hidden size",
        "Hidden sizes of one decode step timed on both devices.",
    )
    accelerator: str = param(
        "", "Accelerator", "", "Device compared with the CPU (cuda, cuda:1, mps); empty: the first one present."
    )


QUICK = Params(matmul=(16, 128, 512), attention=(16, 256), decode=(64, 576, 2048))


def accelerator(requested: str = "") -> str | None:
    """The accelerator to compare against, or None where the CPU is the only device."""
    import torch

    if requested:
        from opscope.engine.core.devices import resolve_device

        return str(resolve_device(requested))
    if torch.cuda.is_available():
        return "cuda:0"
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return "mps"
    return None


def one_device_message() -> str:
    return (
        "crossover: only one device here (cpu, no CUDA/ROCm or MPS GPU visible to torch); this suite "
        "compares the CPU with an accelerator on matmul, attention and a decode step over a sweep of "
        "sizes, host<->device transfer included, and reports the size where the accelerator starts "
        "to win: run it on a machine with a GPU"
    )


# --- the crossover, from timings ----------------------------------------------------------------


def crossover_size(
    sizes: Sequence[int], cpu_s: Sequence[float], acc_s: Sequence[float], transfer_s: Sequence[float]
) -> int | None:
    """The smallest size from which the accelerator (call + transfer) beats the CPU at that size
    and at every larger one; None when it does not win at the largest size."""
    order = sorted(range(len(sizes)), key=lambda i: sizes[i])
    found = None
    for i in reversed(order):
        if acc_s[i] + transfer_s[i] < cpu_s[i]:
            found = sizes[i]
        else:
            break
    return found


def _median_s(outcomes: dict[str, PointOutcome], name: str) -> float | None:
    o = outcomes.get(name)
    if o is None or not o.ok or not o.metrics[0].samples:
        return None
    return statistics.median(o.metrics[0].samples) / 1e3  # points report ms


def crossover_metrics(
    outcomes: list[PointOutcome], sweep: dict[str, Sequence[int]], acc: str, note: dict[str, str]
) -> list[Metric]:
    by_name = {o.point.name: o for o in outcomes}
    out = []
    for workload, sizes in sweep.items():
        rows = []
        for n in sizes:
            t = [_median_s(by_name, point_name(workload, where, n)) for where in ("cpu", "accel", "transfer")]
            if None not in t:
                rows.append((n, *t))
        if not rows:
            note[workload] = "no size measured on both devices"
        else:
            ns, cpu, accel, xfer = (list(col) for col in zip(*rows))
            size = crossover_size(ns, cpu, accel, xfer)
            if size is None:
                note[workload] = f"no crossover: the CPU is faster up to the largest size swept ({max(ns)})"
        if size is None or workload in note:  # said as a metric: the run's settings are saved before this is known
            out.append(
                Metric(
                    f"{workload}.crossover",
                    "size",
                    [],
                    False,
                    {"workload": workload, "accelerator": acc},
                    "failed",
                    note[workload],
                )
            )
            continue
        note[workload] = f"{acc} with transfer is faster from {size} on"
        out.append(
            Metric(f"{workload}.crossover", "size", [float(size)], False, {"workload": workload, "accelerator": acc})
        )
    return out


# --- points -------------------------------------------------------------------------------------


def point_name(workload: str, where: str, n: int) -> str:
    return f"{workload}.{where}.{n}"


def _inputs(workload: str, n: int, dtype) -> tuple[list, list]:
    """(tensors that move per request, tensors resident on the device) on the CPU."""
    import torch

    g = torch.Generator().manual_seed(n)
    if workload == "matmul":
        return [torch.randn(n, n, generator=g).to(dtype), torch.randn(n, n, generator=g).to(dtype)], []
    if workload == "attention":
        return [torch.randn(1, 8, n, 64, generator=g).to(dtype) for _ in range(3)], []
    return [torch.randn(1, n, generator=g).to(dtype)], [
        torch.randn(n, 4 * n, generator=g).to(dtype) / n**0.5,
        torch.randn(4 * n, n, generator=g).to(dtype) / n**0.5,
    ]


def _fn(workload: str):
    import torch.nn.functional as F

    if workload == "matmul":
        return lambda a, b: a @ b
    if workload == "attention":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return lambda x, w1, w2: F.silu(x @ w1) @ w2


def make_point(workload: str, where: str, n: int, device: str, dtype: str) -> Point:
    def prepare():
        moving, resident = _inputs(workload, n, torch_dtype(dtype))
        fn = _fn(workload)
        if where == "cpu":
            return lambda: fn(*moving, *resident)
        on_dev = [t.to(device) for t in moving]
        res_dev = [t.to(device) for t in resident]
        if where == "accel":
            return lambda: fn(*on_dev, *res_dev)
        out_dev = fn(*on_dev, *res_dev)

        def transfer():
            for t in moving:
                t.to(device)
            return out_dev.to("cpu")

        return transfer

    return Point(
        point_name(workload, where, n),
        "ms",
        prepare,
        value=lambda s: s * 1e3,
        higher_is_better=False,
        params={"workload": workload, "where": where, "size": n},
        device="cpu" if where == "cpu" else device,
        max_inner=100,
    )


def _points(sweep: dict[str, Sequence[int]], acc: str, dtype: str):
    for workload, sizes in sweep.items():
        for n in sizes:
            for where in ("cpu", "accel", "transfer"):
                yield make_point(workload, where, n, acc, dtype)


def check_here(opts: BenchOptions, params: Params | None = None) -> None:
    """Before anything is created for the run: a machine with one device says so and stops."""
    p = params or (QUICK if opts.quick else Params())
    if accelerator(p.accelerator) is None:
        raise DeviceError(one_device_message())


def plan(opts: BenchOptions, params: Params | None = None) -> SuitePlan:
    p = params or (QUICK if opts.quick else Params())
    check_here(opts, p)
    acc = accelerator(p.accelerator)
    if acc is None:  # check_here has said so already
        raise DeviceError(one_device_message())
    sweep: dict[str, Sequence[int]] = {w: tuple(getattr(p, w)) for w in WORKLOADS}
    note: dict[str, str] = {}
    settings: dict[str, Any] = {
        "accelerator": acc,
        "sweep": {k: list(v) for k, v in sweep.items()},
        "dtype": opts.dtype,
        "crossover_note": note,
        "rule": "accelerator call + host<->device transfer < CPU call, at that size and every larger one swept",
    }
    return SuitePlan(
        points=list(_points(sweep, acc, opts.dtype)),
        n_points=3 * sum(len(v) for v in sweep.values()),
        settings=settings,
        finish=lambda outcomes: crossover_metrics(outcomes, sweep, acc, note),
    )
