"""`opscope bench collectives --nproc N`: start the ranks, save the run, print nccl-tests' table and
each point's straggler, and optionally write the per-rank Perfetto trace."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import IO, Any


def add_launch_args(p) -> None:
    """--nproc/--nnodes/--node-rank/--rdzv-endpoint/--dist-timeout, each added unless the parser has it
    (the tensor-parallel commands add --nproc of their own)."""
    from opscope.engine.cli import args as check

    have = set(p._option_string_actions)  # argparse's registry of option strings already taken
    g = p.add_argument_group("distributed (torch.distributed through torchrun's elastic agent)")
    if "--nproc" not in have:
        g.add_argument(
            "--nproc",
            type=check.int_in(1, 64, what="processes"),
            default=1,
            metavar="N",
            help="processes (ranks) on this node",
        )
    if "--nnodes" not in have:
        g.add_argument(
            "--nnodes",
            type=check.int_in(1, 1024, what="nodes"),
            default=1,
            metavar="N",
            help="nodes in all (run the same command on each, with its --node-rank)",
        )
        g.add_argument(
            "--node-rank",
            type=check.int_in(0, 1023, what="node rank"),
            default=0,
            metavar="I",
            dest="node_rank",
            help="this node's rank, 0..nnodes-1",
        )
        g.add_argument(
            "--rdzv-endpoint",
            default=None,
            metavar="HOST:PORT",
            dest="rdzv_endpoint",
            help="node 0's address, where the nodes meet (needed with --nnodes > 1)",
        )
        g.add_argument(
            "--dist-timeout",
            type=check.float_in(0.0, lo_open=True, what="seconds"),
            default=None,
            metavar="S",
            dest="dist_timeout_s",
            help="seconds a rendezvous, a collective or a rank's run may take (default 120; collectives: 600)",
        )


def launch_spec(args: argparse.Namespace, default_timeout_s: float = 120.0):
    from opscope.engine.distributed.launch import LaunchSpec

    backend = "nccl" if str(getattr(args, "device", "cpu")).startswith("cuda") else "gloo"
    return LaunchSpec(
        nproc=args.nproc,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        rdzv_endpoint=args.rdzv_endpoint,
        backend=backend,
        timeout_s=args.dist_timeout_s or default_timeout_s,
    )


def run_collectives(args: argparse.Namespace, out: IO[str] | None = None) -> int:
    out = out if out is not None else sys.stdout  # now, not at import: the stream may change
    from opscope.engine.bench.measure.params import parse_cli_params
    from opscope.engine.bench.suites import collectives as suite
    from opscope.engine.core.errors import ConfigError

    world = args.nproc * args.nnodes
    if world < 1:
        raise ConfigError(f"collectives needs at least 1 rank, got --nproc {args.nproc} × --nnodes {args.nnodes}")
    spec = launch_spec(args, default_timeout_s=600.0)
    params = parse_cli_params(suite, args.param, args.quick) or (suite.QUICK if args.quick else suite.Params())
    params = dataclasses.replace(params, nproc=args.nproc)  # the command line's --nproc, saved with the run
    cfg, note = suite.sweep_config(params, spec.resolved_backend() == "nccl", args.quick, world=world)
    ranks = suite.measure(spec, cfg)
    if args.node_rank != 0:  # only node 0 (global rank 0's node) saves and reports the run
        out.write(f"node {args.node_rank}: {len(ranks)} ranks done; node 0 saves the run\n")
        return 0
    result = build_result(args, spec, params, cfg, note, ranks)
    run_id = _save(args, result)
    print_report(result, ranks, run_id, out, note)
    if getattr(args, "trace_out", None):
        from opscope.engine.distributed.ranks import rank_spans, write_chrome_trace

        path = write_chrome_trace({r: rank_spans(ranks[r]) for r in ranks}, args.trace_out)
        out.write(f"per-rank trace: {path} (open in ui.perfetto.dev: one track per rank)\n")
    return 0 if result.status == "completed" else 1


def build_result(args, spec, params, cfg, note, ranks):
    from opscope.engine.bench.suites import collectives as suite
    from opscope.engine.core import fingerprint
    from opscope.engine.core.results import RunResult

    metrics = suite.metrics(ranks)
    settings = {
        "suite": "collectives",
        "quick": bool(args.quick),
        "device": str(getattr(args, "device", "cpu")),
        "backend": spec.resolved_backend(),
        "nproc": spec.nproc,
        "nnodes": spec.nnodes,
        "world_size": len(ranks),
        "timeout_s": spec.timeout_s,
        "suite_params": dataclasses.asdict(params)
        | {
            "sweep": dataclasses.asdict(cfg),
            "note": note,
            "time": "mean of the ranks' times (nccl-tests -a 1)",
            "points": suite.point_details(ranks),
        },
    }
    fp = fingerprint.collect(settings, extra={"ranks": suite.rank_fingerprints(ranks)})
    bad = [m for m in metrics if m.status != "ok"]
    status, error = ("failed", f"{bad[0].name}: {bad[0].error}") if bad else ("completed", None)
    return RunResult(
        kind="collectives",
        name=args.name,
        tags=list(args.tag),
        notes=args.notes,
        settings=settings,
        fingerprint=fp,
        metrics=metrics,
        markers=suite.markers(ranks),
        status=status,
        error=error,
    )


def _save(args, result) -> Any:
    if args.no_save:
        return None
    from opscope.engine.store.access import open_store

    store = open_store(args.db, write=True)
    try:
        return store.save(result)
    finally:
        store.close()


def print_report(result, ranks: dict[int, dict[str, Any]], run_id, out: IO[str], note: str | None) -> None:
    """nccl-tests' columns per size, then the slowest rank and the spread between ranks."""
    from opscope.engine.bench.measure.stats import summarize
    from opscope.engine.distributed.collectives import algbw_gb_s
    from opscope.engine.distributed.ranks import imbalance

    n = len(ranks)
    saved = f"saved as run {run_id}" if run_id is not None else "not saved"
    out.write(
        f"collectives — {result.status} — {saved} — {n} ranks, {result.settings['backend']}, float32; "
        f"medians over repetitions of the ranks' mean time; busbw = algbw × nccl-tests' factor\n"
    )
    out.write(
        f"{'collective':<15}{'form':<6}{'size':>10}{'time µs':>11}{'algbw GB/s':>12}{'busbw GB/s':>12}"
        f"{'#wrong':>8}{'slowest':>9}{'spread':>9}\n"
    )
    by_name = {m.name: m for m in result.metrics}
    details = result.settings["suite_params"]["points"]
    for m in result.metrics:
        if "." in m.name:
            continue
        p = m.params
        t = summarize(by_name[f"{m.name}.time"].samples).median
        busbw = summarize(m.samples).median
        algbw = algbw_gb_s(p["size_bytes"], t / 1e6) if t > 0 else float("nan")  # busbw is 0 for one rank
        per_rank = {r: by_name[f"{m.name}.rank{r}.time"].samples for r in range(n)}
        imb = imbalance(per_rank)
        form = "ip" if p["mode"] == "in_place" else "oop"
        out.write(
            f"{p['collective']:<15}{form:<6}{_size(p['size_bytes']):>10}{t:>11.1f}{algbw:>12.4g}"
            f"{busbw:>12.4g}{details[m.name]['wrong_elements']:>8}{'rank ' + str(imb['slowest_rank']):>9}"
            f"{imb['spread_pct']:>8.0f}%\n"
        )
    out.write(_straggler_line(result, n))
    if note:
        out.write(f"note: {note}\n")
    if result.error:
        out.write(f"run {result.status}: {result.error}\n")


def _straggler_line(result, n: int) -> str:
    """Which rank was slowest how often: one rank slowest at most sizes is a straggler."""
    from collections import Counter

    from opscope.engine.distributed.ranks import imbalance

    by_name = {m.name: m for m in result.metrics}
    slowest: Counter[int] = Counter()
    spreads: list[float] = []
    for m in result.metrics:
        if "." not in m.name:
            imb = imbalance({r: by_name[f"{m.name}.rank{r}.time"].samples for r in range(n)})
            slowest[imb["slowest_rank"]] += 1
            spreads.append(imb["spread_pct"])
    if not spreads:
        return ""
    rank, times = slowest.most_common(1)[0]
    spreads.sort()
    return (
        f"imbalance: rank {rank} was the slowest at {times} of {len(spreads)} points; spread between the "
        f"ranks' median times: median {spreads[len(spreads) // 2]:.0f}%, worst {spreads[-1]:.0f}%\n"
    )


def _size(n: int) -> str:
    from opscope.engine.bench.suites.collectives import size_label

    return size_label(n)
