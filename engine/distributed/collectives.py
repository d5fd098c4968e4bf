"""The collectives nccl-tests measures, run by every rank, with its definitions of size and bandwidth.

Definitions (nccl-tests doc/PERFORMANCE.md): ``size`` is the bytes of the largest buffer a rank
holds (all_gather: the gathered output, reduce_scatter: the input, all_to_all: each rank's send
buffer); ``algbw = size / time``; ``busbw = algbw × factor`` with the factors below, so that busbw
compares with the hardware's per-rank link bandwidth whatever the number of ranks. A repetition's
time is the mean of the ranks' times (nccl-tests' default ``-a 1``); every rank's own time is kept.

Out-of-place and in-place follow nccl-tests where torch.distributed has both forms (all_gather,
reduce_scatter: the rank's chunk of the other buffer; all_to_all); all_reduce and broadcast write
into their input in torch's API (in-place only); send/recv uses two buffers (out-of-place only).
Every point is validated after it is timed: the buffers refilled with known per-rank values, the
collective run once more, every element of the result compared with what it must be.
"""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send_recv")
IN_PLACE_FORMS = {"all_gather", "reduce_scatter", "all_to_all"}
ONLY_IN_PLACE = {"all_reduce", "broadcast"}
ELEMENT_BYTES = 4  # float32, nccl-tests' default type
PATTERN = 5  # values repeat every PATTERN elements: misplaced chunks show up


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests' bus bandwidth factor for ``collective`` over ``n`` ranks."""
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if collective in ("broadcast", "send_recv"):
        return 1.0
    raise ValueError(f"unknown collective {collective!r}; one of {', '.join(COLLECTIVES)}")


def algbw_gb_s(size_bytes: int, seconds: float) -> float:
    return size_bytes / seconds / 1e9


def busbw_gb_s(collective: str, n: int, size_bytes: int, seconds: float) -> float:
    return algbw_gb_s(size_bytes, seconds) * bus_factor(collective, n)


def modes(collective: str) -> tuple[str, ...]:
    if collective in ONLY_IN_PLACE:
        return ("in_place",)
    if collective in IN_PLACE_FORMS:
        return ("out_of_place", "in_place")
    return ("out_of_place",)


def element_count(collective: str, size_bytes: int, n: int) -> int:
    """Elements of the size buffer, rounded down to a multiple of n where it is split into chunks."""
    count = max(1, size_bytes // ELEMENT_BYTES)
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        count = max(n, count // n * n)
    return count


@dataclass(frozen=True)
class SweepConfig:
    """What every rank measures: sizes, collectives, repetitions."""

    sizes_bytes: tuple[int, ...]
    collectives: tuple[str, ...] = COLLECTIVES
    reps: int = 10
    warmup: int = 2
    target_rep_s: float = 2e-3  # small sizes repeat the call inside one timed rep up to this
    max_inner: int = 50
    # Rank 0 rewrites this file with "done total" after each point: the window's progress bar
    # (engine.bench.suites.collectives reads it while the ranks run). None: no progress file.
    progress_path: str | None = None


def sweep_points(cfg: SweepConfig) -> list[tuple[str, int, str]]:
    """(collective, size, mode) of every point, in the order the ranks measure them."""
    return [(c, s, m) for c in cfg.collectives for s in cfg.sizes_bytes for m in modes(c)]


def write_progress(path: str, done: int, total: int) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="ascii") as f:
        f.write(f"{done} {total}\n")
    os.replace(tmp, path)  # a reader never sees a half-written line


def read_progress(path: str) -> tuple[int, int] | None:
    """(done, total) as rank 0 last wrote them; None before the first point is done."""
    try:
        with open(path, encoding="ascii") as f:
            done, total = f.read().split()
        return int(done), int(total)
    except (OSError, ValueError):
        return None


@dataclass
class PointSamples:
    """One (collective, size, mode) on one rank."""

    collective: str
    mode: str
    size_bytes: int
    count: int
    inner: int
    times_s: list[float] = field(default_factory=list)  # per rep, per call
    spans_ns: list[tuple[int, int]] = field(default_factory=list)  # per rep, on this rank's clock
    wrong: int = 0  # elements that failed validation
    error: str | None = None


# -- known values ------------------------------------------------------------------------------
def _ramp(torch, count: int, device, offset: float = 0.0):
    return torch.arange(count, device=device, dtype=torch.float32).remainder_(PATTERN).add_(offset)


def _chunked(torch, count: int, n: int, device, value_of_chunk: Callable[[int], float]):
    c = count // n
    return torch.cat([_ramp(torch, c, device, value_of_chunk(k)) for k in range(n)])


@dataclass
class _Buffers:
    send: Any
    recv: Any
    run: Callable[[], Any]
    expect: Callable[[], Any]
    reset: Callable[[], None]


def _buffers(torch, dist, collective: str, mode: str, count: int, rank: int, n: int, device) -> _Buffers:
    make = _BUILDERS[collective]
    return make(torch, dist, mode, count, rank, n, device)


def _all_reduce(torch, dist, mode, count, rank, n, device):
    buf = torch.empty(count, device=device)

    def reset():
        buf.copy_(_ramp(torch, count, device, rank + 1))

    return _Buffers(
        buf, buf, lambda: dist.all_reduce(buf), lambda: _ramp(torch, count, device).mul_(n).add_(n * (n + 1) / 2), reset
    )


def _broadcast(torch, dist, mode, count, rank, n, device):
    buf = torch.empty(count, device=device)

    def reset():
        buf.copy_(_ramp(torch, count, device, 1.0) if rank == 0 else torch.full_like(buf, -1.0))

    return _Buffers(buf, buf, lambda: dist.broadcast(buf, src=0), lambda: _ramp(torch, count, device, 1.0), reset)


def _all_gather(torch, dist, mode, count, rank, n, device):
    c = count // n
    out = torch.empty(count, device=device)
    inp = out[rank * c : (rank + 1) * c] if mode == "in_place" else torch.empty(c, device=device)

    def reset():
        out.fill_(-1.0)
        inp.copy_(_ramp(torch, c, device, rank + 1))

    return _Buffers(
        inp, out, lambda: _gather_fn(dist)(out, inp), lambda: _chunked(torch, count, n, device, lambda k: k + 1), reset
    )


def _gather_fn(dist):  # torch 2.13 renamed all_gather_into_tensor (deprecated since)
    return getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _scatter_fn(dist):
    return getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _reduce_scatter(torch, dist, mode, count, rank, n, device):
    c = count // n
    inp = torch.empty(count, device=device)
    out = inp[rank * c : (rank + 1) * c] if mode == "in_place" else torch.empty(c, device=device)

    def reset():
        inp.copy_(_ramp(torch, count, device, rank + 1))

    def expect():  # element j of the full array summed over ranks: n * (j % P) + n(n+1)/2
        j = torch.arange(rank * c, (rank + 1) * c, device=device, dtype=torch.float32)
        return j.remainder_(PATTERN).mul_(n).add_(n * (n + 1) / 2)

    return _Buffers(inp, out, lambda: _scatter_fn(dist)(out, inp), expect, reset)


def _all_to_all(torch, dist, mode, count, rank, n, device):
    inp = torch.empty(count, device=device)
    out = inp if mode == "in_place" else torch.empty(count, device=device)

    def reset():  # chunk k goes to rank k carrying rank*n + k + 1
        inp.copy_(_chunked(torch, count, n, device, lambda k: rank * n + k + 1))

    def run():
        if mode == "in_place":  # torch has no aliasing all_to_all: the result lands back in the input
            tmp = torch.empty_like(inp)
            dist.all_to_all_single(tmp, inp)
            inp.copy_(tmp)
        else:
            dist.all_to_all_single(out, inp)

    return _Buffers(inp, out, run, lambda: _chunked(torch, count, n, device, lambda k: k * n + rank + 1), reset)


def _send_recv(torch, dist, mode, count, rank, n, device):
    send, recv = torch.empty(count, device=device), torch.empty(count, device=device)
    to, frm = (rank + 1) % n, (rank - 1) % n

    def reset():
        send.copy_(_ramp(torch, count, device, rank + 1))
        recv.fill_(-1.0)

    def run():  # a ring: every rank sends to the next and receives from the previous at once
        ops = [dist.P2POp(dist.isend, send, to), dist.P2POp(dist.irecv, recv, frm)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()

    return _Buffers(send, recv, run, lambda: _ramp(torch, count, device, frm + 1), reset)


_BUILDERS = {
    "all_reduce": _all_reduce,
    "broadcast": _broadcast,
    "all_gather": _all_gather,
    "reduce_scatter": _reduce_scatter,
    "all_to_all": _all_to_all,
    "send_recv": _send_recv,
}


# -- one rank's sweep --------------------------------------------------------------------------
def _sync(torch, device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _agree_inner(torch, dist, device, seconds: float, cfg: SweepConfig) -> int:
    """Calls per timed rep, the same on every rank (rank 0's estimate wins)."""
    inner = max(1, min(cfg.max_inner, int(cfg.target_rep_s / max(seconds, 1e-9))))
    t = torch.tensor([inner], dtype=torch.int64, device=device)
    dist.broadcast(t, src=0)
    return int(t.item())


def _measure(torch, dist, device, b: _Buffers, point: PointSamples, cfg: SweepConfig) -> None:
    b.reset()
    for _ in range(cfg.warmup):
        b.run()
    _sync(torch, device)
    dist.barrier()
    t0 = time.perf_counter()
    b.run()
    _sync(torch, device)
    point.inner = _agree_inner(torch, dist, device, time.perf_counter() - t0, cfg)
    for _ in range(cfg.reps):
        dist.barrier()  # every rep starts together: a rank's time is its own, not a late start
        start = time.monotonic_ns()
        for _ in range(point.inner):
            b.run()
        _sync(torch, device)
        end = time.monotonic_ns()
        point.times_s.append((end - start) / 1e9 / point.inner)
        point.spans_ns.append((start, end))


def _validate(torch, device, b: _Buffers, point: PointSamples) -> None:
    b.reset()
    b.run()
    _sync(torch, device)
    point.wrong = int((b.recv != b.expect()).sum().item())


def run_point(torch, dist, device, collective: str, mode: str, size_bytes: int, cfg: SweepConfig) -> PointSamples:
    rank, n = dist.get_rank(), dist.get_world_size()
    count = element_count(collective, size_bytes, n)
    point = PointSamples(collective, mode, count * ELEMENT_BYTES, count, 1)
    b = _buffers(torch, dist, collective, mode, count, rank, n, device)
    _measure(torch, dist, device, b, point, cfg)
    _validate(torch, device, b, point)
    return point


def rank_sweep(cfg: SweepConfig) -> dict[str, Any]:
    """Runs on every rank (inside launch()'s process group): the whole sweep, this rank's view."""
    import torch
    import torch.distributed as dist
    from opscope.engine.core import fingerprint
    from opscope.engine.distributed.ranks import clock_alignment

    device = _rank_device(torch, dist)
    clock = clock_alignment(torch, dist, device)
    points = []
    todo = sweep_points(cfg)
    for i, (collective, size, mode) in enumerate(todo):
        points.append(run_point(torch, dist, device, collective, mode, size, cfg))
        if cfg.progress_path and dist.get_rank() == 0:
            write_progress(cfg.progress_path, i + 1, len(todo))
    dist.barrier()
    fp = fingerprint.collect({"rank": dist.get_rank(), "backend": dist.get_backend()})
    mine = {
        "rank": dist.get_rank(),
        "world_size": dist.get_world_size(),
        "backend": dist.get_backend(),
        "device": str(device),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "clock": clock,
        "points": points,
        "fingerprint": fp,
    }
    # The launcher returns only this node's ranks: rank 0 collects every node's, to save one run.
    everyone = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(mine, everyone, dst=0)
    return dict(mine, gathered=everyone) if dist.get_rank() == 0 else mine


def _rank_device(torch, dist):
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def sizes_between(lo: int, hi: int, step: int = 4) -> tuple[int, ...]:
    """lo, lo*step, ... up to hi (nccl-tests' -b lo -e hi -f step)."""
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= step
    return tuple(out)


def mean(values) -> float:
    values = list(values)
    return math.fsum(values) / len(values) if values else float("nan")
