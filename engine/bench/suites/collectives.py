"""collectives: nccl-tests' sweep over torch.distributed (NCCL on CUDA, gloo on the CPU).

Unlike the other suites it runs in several processes: ``measure`` starts the ranks through
engine.distributed.launch, each rank times every (collective, size, form) itself
(engine.distributed.collectives) and returns its samples; ``metrics`` turns them into the run's
metrics. Per point: ``<name>`` busbw (GB/s, one sample per repetition: the size over the mean of
the ranks' times, times nccl-tests' factor), ``<name>.time`` (µs, that mean) and
``<name>.rank<r>.time`` (µs, each rank's own). ``opscope bench collectives --nproc N`` runs it
(engine.distributed.bench_cmd: markers, per-rank fingerprints, trace, straggler table). ``plan``
runs it inside engine.bench.session.run_suite (the window's Benchmarks panel): ``Params.nproc``
ranks on this machine, the whole sweep in the plan's ``finish``, the same metrics.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from typing import Any

from opscope.engine.bench.measure.params import param
from opscope.engine.core.errors import ConfigError
from opscope.engine.core.results import Marker, Metric
from opscope.engine.distributed.collectives import (
    COLLECTIVES,
    SweepConfig,
    bus_factor,
    busbw_gb_s,
    mean,
    read_progress,
    sizes_between,
    sweep_points,
)

log = logging.getLogger(__name__)

NAME = "collectives"
DESCRIPTION = "all_reduce, all_gather, reduce_scatter, broadcast, all_to_all, send/recv: nccl-tests' busbw per size"
RUNS_RANKS = True
GIB = 2**30
# Without a GPU every rank holds its buffers in host memory (up to ~3 per point, several ranks):
# 64 MiB keeps a default CPU run well under 2 GiB; on CUDA the sweep goes to nccl-tests' usual 1 GiB.
CPU_MAX_BYTES = 64 * 2**20


@dataclass(frozen=True)
class Params:
    # 8 B … 1 GiB in x4 steps (CPU: capped, see plan)
    sizes_bytes: tuple[int, ...] = param(
        sizes_between(8, GIB), "Message sizes", "bytes", "Bytes each collective moves per call (nccl-tests -b … -e)."
    )
    collectives: tuple[str, ...] = param(
        COLLECTIVES,
        "Collectives",
        "",
        "Operations measured: all_reduce, all_gather, reduce_scatter, broadcast, all_to_all, send_recv.",
    )
    reps: int = param(10, "Repetitions", "", "Timed repetitions per size (nccl-tests -n).")
    nproc: int = param(
        2,
        "Ranks",
        "processes",
        "Processes started on this machine, one rank each (the command line's --nproc); at least 2.",
    )


QUICK = Params(sizes_bytes=(8, 1024, 65536), reps=5)
WINDOW_TIMEOUT_S = 600.0


def plan(opts, params=None):
    """The sweep as a run_suite plan: no timed points of the runner's, ``finish`` launches the
    ranks (``params.nproc`` on this machine) and returns every point's metrics."""
    from opscope.engine.bench.measure.options import SuitePlan
    from opscope.engine.distributed.launch import LaunchSpec

    p = params or (QUICK if opts.quick else Params())
    if p.nproc < 1:
        raise ConfigError(f"collectives needs at least 1 rank, got nproc {p.nproc}")
    spec = LaunchSpec(
        nproc=p.nproc, backend="nccl" if str(opts.device).startswith("cuda") else "gloo", timeout_s=WINDOW_TIMEOUT_S
    )
    cfg, note = sweep_config(p, spec.backend == "nccl", opts.quick, world=p.nproc)
    settings = {
        "backend": spec.backend,
        "nproc": p.nproc,
        "world_size": p.nproc,
        "timeout_s": spec.timeout_s,
        "sweep": {"sizes_bytes": list(cfg.sizes_bytes), "collectives": list(cfg.collectives), "reps": cfg.reps},
        "note": note,
        "time": "mean of the ranks' times (nccl-tests -a 1)",
    }

    total = len(sweep_points(cfg))
    rank_markers: list[Marker] = []

    def finish(_outcomes, progress=None) -> list[Metric]:
        ranks = measure_reporting(spec, cfg, progress)
        wrong = {k: v for k, v in point_details(ranks).items() if v["wrong_elements"]}
        if wrong:
            log.warning("collectives: wrong elements at %s", ", ".join(wrong))
        rank_markers.extend(markers(ranks))  # the same per-rank markers `bench collectives --nproc` saves
        return metrics(ranks)

    return SuitePlan(
        points=[], n_points=total, settings=settings, finish=finish, finish_reports_progress=True, markers=rank_markers
    )


PROGRESS_POLL_S = 0.2


def measure_reporting(spec, cfg: SweepConfig, progress=None) -> dict[int, dict[str, Any]]:
    """``measure``, calling ``progress(done, total, eta_s)`` as rank 0 finishes each point (it
    writes them to a file in a temporary folder, read here every PROGRESS_POLL_S)."""
    if progress is None:
        return measure(spec, cfg)
    import tempfile
    import threading
    import time

    total = len(sweep_points(cfg))
    with tempfile.TemporaryDirectory(prefix="opscope-collectives-") as folder:
        path = os.path.join(folder, "progress")
        stop, start, last = threading.Event(), time.monotonic(), [0]

        def report() -> None:
            done = (read_progress(path) or (0, total))[0]
            if done > last[0]:
                last[0] = done
                progress(float(done), total, (time.monotonic() - start) / done * (total - done))

        def poll() -> None:
            while not stop.wait(PROGRESS_POLL_S):
                report()

        watcher = threading.Thread(target=poll, name="collectives-progress", daemon=True)
        watcher.start()
        try:
            ranks = measure(spec, dataclasses.replace(cfg, progress_path=path))
        finally:
            stop.set()
            watcher.join()
        report()  # the last point, written after the watcher's last look
        return ranks


def sweep_config(params: Params, on_cuda: bool, quick: bool, world: int = 2) -> tuple[SweepConfig, str | None]:
    """The ranks' sweep and, where the CPU cap cut sizes or one rank is all there is, a note saying so.

    A world of one (a one-GPU machine) still sets up the backend's communicator and runs every
    collective through it, so NCCL is exercised; no link is crossed (busbw is 0 by nccl-tests'
    factors) and send/recv, which needs a peer, is left out."""
    bad = [c for c in params.collectives if c not in COLLECTIVES]
    if bad:
        raise ConfigError(f"collectives {', '.join(bad)}: unknown; choose from {', '.join(COLLECTIVES)}")
    sizes, notes, collectives = params.sizes_bytes, [], params.collectives
    if not on_cuda and dataclasses.replace(params, nproc=Params.nproc) == Params():  # the default sweep
        sizes = tuple(s for s in sizes if s <= CPU_MAX_BYTES)
        notes.append(
            f"sizes capped at {CPU_MAX_BYTES // 2**20} MiB on the CPU (host memory); "
            f"give --param sizes_bytes=... for larger"
        )
    if world == 1:
        collectives = tuple(c for c in collectives if c != "send_recv")
        notes.append(
            "world size 1: the backend's own set-up and launch cost, no link crossed (busbw 0); "
            "send_recv needs 2 ranks and is left out"
        )
    if not collectives:
        raise ConfigError("collectives: nothing left to run with one rank (send_recv needs 2)")
    note = "; ".join(notes) or None
    cfg = SweepConfig(
        sizes_bytes=sizes,
        collectives=collectives,
        reps=params.reps,
        warmup=1 if quick else 2,
        target_rep_s=5e-4 if quick else 2e-3,
        max_inner=8 if quick else 50,
    )
    return cfg, note


def measure(spec, cfg: SweepConfig) -> dict[int, dict[str, Any]]:
    """Every rank's results: {rank: engine.distributed.collectives.rank_sweep's dict}."""
    from opscope.engine.distributed.collectives import rank_sweep
    from opscope.engine.distributed.launch import launch

    local = launch(spec, rank_sweep, cfg)
    if 0 in local:  # this node has rank 0, which gathered every node's ranks
        return {r["rank"]: r for r in local[0]["gathered"]}
    return local


def size_label(n: int) -> str:
    """Exact binary size without a dot (metric names use '.' for a point's sub-metrics): 8B, 64KiB, 1GiB."""
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return f"{n}B"


def point_name(collective: str, size_bytes: int, mode: str) -> str:
    return f"{collective}_{size_label(size_bytes)}_{'ip' if mode == 'in_place' else 'oop'}"


def _points(ranks: dict[int, dict[str, Any]]):
    """(this point on every rank) for each point, in sweep order."""
    order = sorted(ranks)
    for i in range(len(ranks[order[0]]["points"])):
        yield {r: ranks[r]["points"][i] for r in order}


def point_metrics(per_rank: dict, n: int) -> list[Metric]:
    """busbw, mean time and every rank's time of one point."""
    first = per_rank[min(per_rank)]
    coll, size, mode = first.collective, first.size_bytes, first.mode
    name = point_name(coll, size, mode)
    reps = min(len(p.times_s) for p in per_rank.values())
    mean_s = [mean(p.times_s[i] for p in per_rank.values()) for i in range(reps)]
    wrong = sum(p.wrong for p in per_rank.values())
    # only what defines the point: compare matches rows on name, unit and params
    params = {
        "collective": coll,
        "size_bytes": size,
        "mode": mode,
        "ranks": n,
        "count": first.count,
        "dtype": "float32",
        "bus_factor": bus_factor(coll, n),
    }
    status, error = ("ok", None) if wrong == 0 else ("failed", f"invalid: {wrong} wrong elements after {coll}")
    out = [
        Metric(name, "GB/s", [busbw_gb_s(coll, n, size, t) for t in mean_s], True, params, status, error),
        Metric(f"{name}.time", "us", [t * 1e6 for t in mean_s], False, params, status, error),
    ]
    for r, p in sorted(per_rank.items()):
        out.append(
            Metric(
                f"{name}.rank{r}.time", "us", [t * 1e6 for t in p.times_s], False, params | {"rank": r}, status, error
            )
        )
    return out


def metrics(ranks: dict[int, dict[str, Any]]) -> list[Metric]:
    n = len(ranks)
    return [m for per_rank in _points(ranks) for m in point_metrics(per_rank, n)]


def point_details(ranks: dict[int, dict[str, Any]]) -> dict[str, dict[str, int]]:
    """{point name: calls per timed repetition, wrong elements over all ranks} (saved in the settings)."""
    out = {}
    for per_rank in _points(ranks):
        first = per_rank[min(per_rank)]
        out[point_name(first.collective, first.size_bytes, first.mode)] = {
            "calls_per_rep": first.inner,
            "wrong_elements": sum(p.wrong for p in per_rank.values()),
        }
    return out


def markers(ranks: dict[int, dict[str, Any]]) -> list[Marker]:
    """Each rank's timed repetitions on rank 0's clock, as start/end markers carrying the rank."""
    from opscope.engine.distributed.ranks import rank_spans

    out = []
    for r in sorted(ranks):
        for s in rank_spans(ranks[r]):
            attrs = {"rank": r, "name": s["name"], **s["args"]}
            out += [
                Marker("collective", "start", s["start_ns"], attrs),
                Marker("collective", "end", s["end_ns"], attrs),
            ]
    return out


def rank_fingerprints(ranks: dict[int, dict[str, Any]]) -> dict[str, Any]:
    return {
        str(r): {
            "host": ranks[r]["host"],
            "device": ranks[r]["device"],
            "clock": ranks[r]["clock"],
            **ranks[r]["fingerprint"],
        }
        for r in sorted(ranks)
    }
