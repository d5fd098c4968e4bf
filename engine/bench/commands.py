"""`opscope bench SUITE`: run a benchmark suite with a progress bar, save it, print its summary."""
from __future__ import annotations

import argparse
import sys
import threading

from opscope.engine.bench.suites import SUITES


def register(subparsers) -> None:
    from opscope.engine import cli_args as check
    from opscope.engine.bench.quality import DISTURBED_CORES
    from opscope.engine.cli_common import add_model_args

    p = subparsers.add_parser(
        "bench", help="run a benchmark suite and save the run",
        description="Run a benchmark suite, save every raw sample to the run store, print a summary. "
                    f"Suites: {', '.join(SUITES)}.")
    p.add_argument("suite", choices=list(SUITES), metavar="SUITE", help=" | ".join(SUITES))
    add_model_args(p)
    g = p.add_argument_group("benchmark")
    g.add_argument("--quick", action="store_true", help="tiny sizes: the whole suite in under a minute")
    g.add_argument("--repeat", type=check.positive_int, default=None, help="minimum repetitions per point")
    g.add_argument("--min-time", type=check.float_in(0.0), default=None, dest="min_time_s",
                   help="minimum seconds of repetitions per point")
    g.add_argument("--warmup", type=check.count, default=None, help="warm-up calls per point (never recorded)")
    g.add_argument("--load-threshold", type=check.float_in(0.0, lo_open=True, what="CPU cores"), default=None,
                   metavar="CORES", dest="load_threshold",
                   help=f"a repetition taken while other processes kept at least this many CPU cores busy is "
                        f"disturbed: re-run within a budget and marked (default {DISTURBED_CORES:g})")
    g.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                   help="a suite parameter (repeatable; lists comma-separated), e.g. "
                        "--param peers=opscope,llama_cpp --param tg=64")
    g.add_argument("--name", default="", help="unique run name (default: SUITE-DATE-TIME)")
    g.add_argument("--tag", action="append", default=[], help="tag the run (repeatable)")
    g.add_argument("--notes", default="", help="free text saved with the run")
    g.add_argument("--no-save", action="store_true", help="measure and print, do not save")
    g.add_argument("--telemetry", type=check.telemetry_interval_ms(), default=None, metavar="MS",
                   help="sample telemetry every MS ms and save it with the run's phase markers "
                        "(off by default: the sampler thread costs CPU time on small machines)")
    p.set_defaults(func=cmd_bench)


def options_from_args(args: argparse.Namespace):
    from opscope.engine.bench.options import BenchOptions

    return BenchOptions(device=args.device, dtype=args.dtype, quick=args.quick, model=args.model,
                        backend=args.backend, threads=args.threads, attention=args.attention,
                        fastpath=getattr(args, "fastpath", "auto"), compile=getattr(args, "compile", "off"),
                        quantize=getattr(args, "quantize", "off"), repeat=args.repeat,
                        min_time_s=args.min_time_s, warmup=args.warmup,
                        load_threshold=getattr(args, "load_threshold", None))


def cmd_bench(args: argparse.Namespace) -> int:
    from opscope.engine.bench.params import parse_cli_params
    from opscope.engine.bench.report import progress_bar, summary_table
    from opscope.engine.bench.session import run_suite
    from opscope.engine.bench.suites import get_suite

    opts = options_from_args(args)
    params = parse_cli_params(get_suite(args.suite), args.param, opts.quick)
    if opts.backend == "torch":  # a device that cannot run fails before a store is created for it
        from opscope.engine.bench.options import check_torch_device

        check_torch_device(opts.device)
    store = sampler = None
    try:
        if not args.no_save:
            from opscope.engine.store.commands import open_store

            store = open_store(args.db, write=True)
        sampler, recorder = _telemetry(args.telemetry)
        with progress_bar(f"bench {args.suite}") as progress:
            run_id, result = run_suite(args.suite, opts, store, name=args.name, tags=args.tag,
                                       notes=args.notes, params=params, progress=progress,
                                       cancel=threading.Event(), recorder=recorder)
    finally:
        if sampler is not None:
            sampler.stop()
        if store is not None:
            store.close()
    summary_table(result, run_id, sys.stdout)
    return 0 if result.status == "completed" else 1


def _telemetry(interval_ms: float | None):
    """(sampler, recorder) when telemetry was asked for, else (None, None)."""
    if interval_ms is None:
        return None, None
    from opscope.engine.telemetry.recorder import Recorder
    from opscope.engine.telemetry.sampler import Sampler

    sampler = Sampler(interval_ms=interval_ms).start()
    return sampler, Recorder(sampler)
