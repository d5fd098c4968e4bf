"""`opscope bench SUITE`: run a benchmark suite with a progress bar, save it, print its summary."""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import threading
from datetime import UTC

from opscope.engine.bench.suites import SUITES


def register(subparsers) -> None:
    from opscope.engine.bench.measure.quality import DISTURBED_CORES
    from opscope.engine.cli import args as check
    from opscope.engine.cli.common import add_model_args

    p = subparsers.add_parser(
        "bench",
        help="run a benchmark suite and save the run",
        add_help=False,
        description="Run a benchmark suite, save every raw sample to the run store, print a summary. "
        f"Suites: {', '.join(SUITES)}.",
    )
    p.add_argument("-h", "--help", action=SuiteHelp, help="show this help (after SUITE: with its parameters)")
    p.add_argument("suite", choices=list(SUITES), metavar="SUITE", help=" | ".join(SUITES))
    add_model_args(p)
    g = p.add_argument_group("benchmark")
    g.add_argument(
        "--quick",
        action="store_true",
        help="tiny sizes and a 60 s time budget the runner keeps: each point repeats for its share "
        "of the time left, and once that is spent it stops adding repetitions (one kept at "
        "least; loading and warm-up calls are not cut) and the run says so",
    )
    g.add_argument("--repeat", type=check.repeat, default=None, help="minimum repetitions per point")
    g.add_argument(
        "--min-time",
        type=check.min_time_s,
        default=None,
        dest="min_time_s",
        help="minimum seconds of repetitions per point",
    )
    g.add_argument("--warmup", type=check.warmup, default=None, help="warm-up calls per point (never recorded)")
    g.add_argument(
        "--load-threshold",
        type=check.float_in(0.0, lo_open=True, what="CPU cores"),
        default=None,
        metavar="CORES",
        dest="load_threshold",
        help=f"a repetition taken while other processes kept at least this many CPU cores busy is "
        f"disturbed: re-run within a budget and marked (default {DISTURBED_CORES:g})",
    )
    g.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a suite parameter (repeatable; lists comma-separated), e.g. "
        "--param peers=opscope,llama_cpp --param tg=64; `opscope bench SUITE --help` "
        "lists SUITE's parameters",
    )
    g.add_argument("--name", type=check.run_name, default="", help="unique run name (default: SUITE-DATE-TIME)")
    g.add_argument("--tag", action="append", type=check.tag, default=[], help="tag the run (repeatable)")
    g.add_argument("--notes", default="", help="free text saved with the run")
    g.add_argument("--no-save", action="store_true", help="measure and print, do not save")
    if "--nproc" not in p._option_string_actions:
        g.add_argument(
            "--nproc",
            type=check.int_in(1, 64, what="processes"),
            default=1,
            metavar="N",
            help="processes (ranks) on this node, started by torch's launcher: llm runs the "
            "model tensor-parallel over them (N divides the KV heads; dense weights)",
        )
    g.add_argument(
        "--ab",
        default=None,
        metavar="FLAGS",
        help="also run the suite with these flags changed (e.g. --ab '--fastpath off'; '' for an "
        "A/A check), the two settings' repetitions interleaved ABBA in one process so the "
        "machine's drift between runs cannot pass for a change; saves NAME-a and NAME-b and "
        "prints B against A",
    )
    g.add_argument(
        "--telemetry",
        type=check.telemetry_interval_ms(),
        default=None,
        metavar="MS",
        help="sample telemetry every MS ms and save it with the run's phase markers "
        "(off by default: the sampler thread costs CPU time on small machines)",
    )
    from opscope.engine.cli.commands.collectives import add_launch_args

    add_launch_args(p)  # collectives (and tensor-parallel suites): ranks through torchrun's agent
    g.add_argument(
        "--trace-out",
        type=check.output_file,
        default=None,
        metavar="PATH.json",
        dest="trace_out",
        help="collectives, llm --nproc N: write every rank's timeline as a Chrome/Perfetto trace, one process per rank",
    )
    p.set_defaults(func=cmd_bench)


class SuiteHelp(argparse.Action):
    """``-h``/``--help``: the usual help, then, when SUITE came before it, the suite's parameters
    as its Params declare them (name=default, label (unit): help)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        parser.print_help()
        suite = getattr(namespace, "suite", None)
        if suite in SUITES:
            from opscope.engine.bench.measure.params import param_help_lines
            from opscope.engine.bench.suites import get_suite

            lines = param_help_lines(get_suite(suite).Params)
            sys.stdout.write(f"\n{suite} parameters (--param KEY=VALUE, default shown):\n" + "\n".join(lines) + "\n")
        parser.exit()


def options_from_args(args: argparse.Namespace):
    from opscope.engine.bench.measure.options import BenchOptions

    return BenchOptions(
        device=args.device,
        dtype=args.dtype,
        quick=args.quick,
        model=args.model,
        backend=args.backend,
        threads=args.threads,
        attention=args.attention,
        fastpath=getattr(args, "fastpath", "auto"),
        compile=getattr(args, "compile", "off"),
        quantize=getattr(args, "quantize", "off"),
        repeat=args.repeat,
        min_time_s=args.min_time_s,
        warmup=args.warmup,
        load_threshold=getattr(args, "load_threshold", None),
    )


def check_model(opts) -> None:
    """A --model path that cannot be a model fails in one line before a run store is created for it."""
    if opts.model is not None:
        from opscope.engine.formats import check_model_path

        check_model_path(opts.model)


def cmd_bench(args: argparse.Namespace, model=None) -> int:
    from opscope.engine.bench.measure.params import parse_cli_params
    from opscope.engine.bench.report import progress_bar, summary_table
    from opscope.engine.bench.session import run_suite
    from opscope.engine.bench.suites import get_suite

    if getattr(args, "ab", None) is not None:
        return cmd_bench_ab(args)
    if args.suite == "collectives":  # several processes: its own session (engine.distributed.bench_cmd)
        from opscope.engine.cli.commands.collectives import run_collectives

        return run_collectives(args)
    opts = options_from_args(args)
    params = parse_cli_params(get_suite(args.suite), args.param, opts.quick)
    if model is None:
        check_model(opts)
    if opts.backend == "torch":  # a device that cannot run fails before a store is created for it
        from opscope.engine.bench.measure.options import check_torch_device

        check_torch_device(opts.device)
    check_here = getattr(get_suite(args.suite), "check_here", None)
    if check_here is not None:  # e.g. crossover on a machine with one device
        check_here(opts, params)
    if getattr(args, "nproc", 1) > 1 and args.suite != "llm":
        from opscope.engine.core.errors import ConfigError

        raise ConfigError(
            f"--nproc {args.nproc}: bench {args.suite} runs in one process; --nproc applies to "
            f"bench llm (tensor-parallel) and bench collectives"
        )
    if model is None and getattr(args, "nproc", 1) > 1 and args.suite == "llm":
        from opscope.engine.distributed.tp_worker import BENCH_TIMEOUT_S, job_from_args, run_tp

        return run_tp(job_from_args(args, BENCH_TIMEOUT_S), bench_with, args)
    from opscope.engine.store.save_guard import raise_unsaved, saved, saving

    sampler = None
    with saving(args.db, args.no_save) as store:  # a failed save must not lose the results
        try:
            sampler, recorder = _telemetry(args.telemetry)
            if getattr(model, "tp", None) is not None:  # --nproc: each rank's forwards and all_reduces as markers
                recorder = model.tp.recorder(recorder)
            with progress_bar(f"bench {args.suite}") as progress:
                run_id, result = run_suite(
                    args.suite,
                    opts,
                    store,
                    name=args.name,
                    tags=args.tag,
                    notes=args.notes,
                    params=params,
                    progress=progress,
                    cancel=threading.Event(),
                    recorder=recorder,
                    model=model,
                )
        finally:
            if sampler is not None:
                sampler.stop()
    summary_table(result, run_id if saved(store) else None, sys.stdout)
    raise_unsaved(store)
    return 0 if result.status == "completed" else 1


def bench_with(lm, args: argparse.Namespace) -> int:
    """`opscope bench llm --nproc N` on rank 0: the suite on its tensor-parallel model, then the
    ranks' all_reduce share, imbalance and (--trace-out) per-rank trace."""
    code = cmd_bench(args, model=lm)
    lm.tp.report(sys.stdout, getattr(args, "trace_out", None))
    return code


def _telemetry(interval_ms: float | None):
    """(sampler, recorder) when telemetry was asked for, else (None, None)."""
    if interval_ms is None:
        return None, None
    from opscope.engine.telemetry.recorder import Recorder
    from opscope.engine.telemetry.sampler import Sampler

    sampler = Sampler(interval_ms=interval_ms).start()
    return sampler, Recorder(sampler)


def b_args(args: argparse.Namespace) -> argparse.Namespace:
    """Side B's arguments: A's, with the --ab flags parsed over them (``--param`` adds to A's)."""
    import copy
    import shlex

    from opscope.engine.cli.args import CliParser
    from opscope.engine.core.errors import ConfigError

    sub = CliParser(prog="opscope").add_subparsers()
    register(sub)
    parser = sub.choices["bench"]
    parser.prog = "opscope bench --ab"
    try:
        words = shlex.split(args.ab)
    except ValueError as e:
        raise ConfigError(f"--ab {args.ab!r}: {e}; quote it as one shell word, e.g. --ab '--fastpath off'") from e
    base = copy.deepcopy(args)
    base.ab = None
    b = parser.parse_args([args.suite, *words], namespace=base)
    if b.ab is not None or b.name != args.name or b.no_save != args.no_save or b.telemetry != args.telemetry:
        raise ConfigError(
            "--ab flags may change what is measured (model, device settings, --param), not "
            "--ab, --name, --no-save or --telemetry"
        )
    return b


def ab_side(opts, suite: str, flags: str):
    """Side B of an A/B run made outside the command line (the GUI): ``flags``, as ``--ab`` takes
    them, parsed over side A's options. Returns (B's BenchOptions, B's ``--param`` pairs)."""
    from opscope.engine.cli.args import CliParser

    sub = CliParser(prog="opscope").add_subparsers()
    register(sub)
    a = sub.choices["bench"].parse_args([suite])
    for key in (
        "device",
        "dtype",
        "quick",
        "model",
        "backend",
        "threads",
        "attention",
        "fastpath",
        "compile",
        "quantize",
        "repeat",
        "min_time_s",
        "warmup",
        "load_threshold",
    ):
        setattr(a, key, getattr(opts, key))
    a.ab = flags
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            b = b_args(a)
    except SystemExit as e:  # argparse's one-line error: a message here, not an exit
        from opscope.engine.core.errors import ConfigError

        text = said.getvalue().strip().removeprefix("opscope: error:").strip() or "not valid bench flags"
        raise ConfigError(f"A/B flags {flags!r}: {text}") from e
    return options_from_args(b), list(b.param)


def cmd_bench_ab(args: argparse.Namespace) -> int:
    """`opscope bench SUITE ... --ab FLAGS`: both settings interleaved (engine.bench.ab), two runs
    saved, B compared against A."""
    from opscope.engine.bench.ab import Side, check_sides, pair_names, run_ab
    from opscope.engine.bench.measure.params import parse_cli_params
    from opscope.engine.bench.report import progress_bar, summary_table
    from opscope.engine.bench.suites import get_suite
    from opscope.engine.core.errors import ConfigError

    if args.telemetry is not None:
        raise ConfigError("--telemetry is not available with --ab: run the settings one at a time to record it")
    names = pair_names(args.name, args.suite)
    sides = []
    for side_args, name, flags in ((args, names[0], ""), (b_args(args), names[1], args.ab)):
        opts = options_from_args(side_args)
        params = parse_cli_params(get_suite(args.suite), side_args.param, opts.quick)
        check_model(opts)
        sides.append(Side(opts, params, name, flags))
    check_sides(*sides)  # before a store is created for runs that cannot be made
    from opscope.engine.store.save_guard import raise_unsaved, saved, saving

    with saving(args.db, args.no_save) as store:  # a failed save must not lose the results
        with progress_bar(f"bench {args.suite} --ab") as progress:
            runs = run_ab(
                args.suite,
                (sides[0], sides[1]),
                store,
                tags=args.tag,
                notes=args.notes,
                progress=progress,
                cancel=threading.Event(),
            )
        stored = _stored_pair(store, runs) if saved(store) else None
    for run_id, result in runs:
        summary_table(result, run_id if stored else None, sys.stdout)
    sys.stdout.write(_ab_comparison(stored, runs))
    raise_unsaved(store)
    return 0 if all(result.status == "completed" for _, result in runs) else 1


def _stored_pair(store, runs) -> list | None:
    """Both runs read back from the store (None when that fails: the pair then counts as unsaved)."""
    from opscope.engine.store.save_guard import saved

    stored = [store.load(run_id) for run_id, _ in runs]
    return stored if saved(store) and None not in stored else None


def _ab_comparison(stored, runs) -> str:
    """B against A as `opscope runs compare` prints it (as read back from the store, or from memory
    when unsaved)."""
    from opscope.engine.store.compare import compare
    from opscope.engine.store.convert import StoredRun
    from opscope.engine.store.render import render

    if stored is None:
        # unsaved runs have no ids to tell them apart (both "#0"): they are named by their side
        stored = [
            StoredRun(_memory_info(result, side), _as_side(result, side)) for (_, result), side in zip(runs, "AB")
        ]
    return "\n" + render(compare(stored), "text")


def _as_side(result, side: str):
    """``result`` shown as side A or B of the pair (for an unsaved pair's comparison)."""
    import dataclasses

    pair = dict(result.settings.get("interleaved") or {}, pair=["A", "B"])
    return dataclasses.replace(result, name=side, settings={**result.settings, "interleaved": pair})


def _memory_info(result, name: str):
    from datetime import datetime

    from opscope.engine.store.convert import RunInfo

    now = datetime.now(UTC)
    return RunInfo(
        id=0,
        name=name,
        kind=result.kind,
        status=result.status,
        tags=tuple(result.tags),
        notes=result.notes,
        created_at=now,
        finished_at=now,
        error=result.error,
        metric_count=len(result.metrics),
        quality=result.quality,
    )
