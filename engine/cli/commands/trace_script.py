"""The script side of `opscope trace`: `-- python SCRIPT [ARGS]` and `diff A B`.

The report goes to stdout after the script's own output; the exit code is the script's.
Imports nothing heavy at module level: the CLI builds its parser from this.
"""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from pathlib import Path

from opscope.engine.cli import args as check
from opscope.engine.core import json_output
from opscope.engine.core.errors import ConfigError
from opscope.engine.trace.script import _is_python as is_python  # noqa: F401 - re-exported for the command

log = logging.getLogger(__name__)

CPU_TARGET_NOTE = (
    "the target is the host (cpu): there are no host↔device copies to see; per-element "
    "loops show as host value reads (syncs). Trace on a GPU with --target cuda for transfers"
)


def add_script_args(p) -> None:
    s = p.add_argument_group("your own script (`opscope trace [OPTIONS] -- python SCRIPT [ARGS]`)")
    s.add_argument(
        "--target", default=None, help="device the script should run on (default: cuda when available, else cpu)"
    )
    s.add_argument(
        "--telemetry",
        type=check.telemetry_interval_ms(),
        default=None,
        metavar="MS",
        help="sample host/GPU telemetry every MS ms alongside, with the steps as phases",
    )
    s.add_argument("--cwd", default=None, help="working directory for the script (default: the current one)")
    s.add_argument(
        "--report", type=check.output_path, default=None, metavar="PATH", help="also write the report as JSON here"
    )
    s.add_argument("--name", default="", help="name of the saved trace run (default: trace-DATE-TIME)")
    s.add_argument("--no-save", action="store_true", help="do not save the trace in the run store")


def default_target() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _check(args) -> None:
    for path in (args.out, args.jsonl, args.report):
        if path is not None and not Path(path).parent.is_dir():
            raise ConfigError(f"cannot write {path}: folder {Path(path).parent} does not exist")
    if args.telemetry is not None and args.telemetry <= 0:
        raise ConfigError(f"--telemetry must be a positive interval in ms, got {args.telemetry}")
    if args.cwd is not None and not Path(args.cwd).is_dir():
        raise ConfigError(f"--cwd {args.cwd}: no such folder")


def _telemetry(interval_ms: float | None):
    if interval_ms is None:
        return None, None
    from opscope.engine.telemetry.recorder import Recorder
    from opscope.engine.telemetry.sampler import Sampler

    sampler = Sampler(interval_ms=interval_ms).start()
    return sampler, Recorder(sampler)


def cmd_script(args, words: list[str]) -> int:
    from opscope.engine.trace.events import TraceOptions
    from opscope.engine.trace.script import parse_command, trace_script

    _check(args)
    spec = parse_command(words, args.cwd)
    target = (args.target or default_target()).strip().lower()
    options = TraceOptions(target=target, source=args.source, max_events=args.max_events)
    sampler, recorder = _telemetry(args.telemetry)
    try:
        if recorder is not None:
            recorder.start()
        started_at = datetime.now(UTC)
        trace = trace_script(spec, options)
        finished_at = datetime.now(UTC)
        if recorder is not None:
            recorder.stop()
        report = script_report(trace)
        _emit(args, trace, report, recorder, (started_at, finished_at))
    finally:
        if sampler is not None:
            sampler.stop()
    return trace.outcome.exit_code


def script_report(trace):
    """The placement report of a script's trace, in steps, with the training-health findings."""
    from dataclasses import replace

    from opscope.engine.trace.findings import SCRIPT_IO
    from opscope.engine.trace.report import build_report

    notes = [
        f"steps: {trace.step_source}"
        + ("" if trace.step_source != "whole run" else " (no opscope.step() and no optimizer.step() was called)")
    ]
    if trace.result.options.target == "cpu":
        notes.append(CPU_TARGET_NOTE)
    if trace.outcome.exit_code:
        notes.append(
            f"the script ended with exit code {trace.outcome.exit_code}"
            + (": the trace covers it up to the exception" if trace.outcome.error else "")
        )
    if not trace.losses:
        notes.append("training health: not judged (no scalar loss with values reached backward())")
    report = build_report(trace.result, notes, unit="step", io=SCRIPT_IO)
    setup = [
        f"{row.source or '?'} ({', '.join(op.split('.')[1] for op in row.ops)})"
        for row in report.fallbacks
        if not row.per_token  # in step 0 alone (engine.trace.findings._setup_only)
    ]
    if report.tokens > 1 and setup:
        notes.append(
            f"setup computed off {report.target} in step 0 only, at {'; '.join(setup[:3])}: once, not per step"
        )
    return replace(report, notes=notes, findings=list(trace.health) + list(report.findings))


def _emit(args, trace, report, recorder, times: tuple[datetime, datetime]) -> None:
    from opscope.engine.trace import runs
    from opscope.engine.trace.export import write_chrome_trace, write_jsonl
    from opscope.engine.trace.render import render_text

    sys.stdout.flush()
    data = dict(
        report.as_dict(),
        script=trace.spec.label,
        step_source=trace.step_source,
        exit_code=trace.outcome.exit_code,
        losses=trace.losses[:2000],
    )
    if args.out:
        write_chrome_trace(trace.result, args.out, report.as_dict())
    if args.jsonl:
        write_jsonl(trace.result, args.jsonl)
    if args.report:
        Path(args.report).write_text(json_output.dumps(data, indent=1, default=str))
    print("\n" + "=" * 24 + f" opscope trace: {trace.spec.label} " + "=" * 24)
    if args.json:
        print(json_output.dumps(data, indent=1, default=str))
    else:
        print(render_text(report, title=trace.spec.label), end="")
        if trace.step_ms:
            ms = sorted(trace.step_ms)
            print(
                f"step time: median {ms[len(ms) // 2]:.3f} ms over {len(ms)} steps after the first "
                f"(min {ms[0]:.3f}, max {ms[-1]:.3f}); steps from {trace.step_source}"
            )
    for label, path in (
        ("Chrome trace / Perfetto JSON", args.out),
        ("events (JSON lines)", args.jsonl),
        ("report (JSON)", args.report),
    ):
        if path:
            print(f"{label}: {path}")
    if not args.no_save:
        run = runs.run_result(trace, report, name=args.name, recorder=recorder)
        run.started_at, run.finished_at = times
        run_id, name = runs.save(run, args.db)
        print(f"saved as run {run_id} ({name}); compare two with `opscope trace diff A B`")


def cmd_diff(args, refs: list[str]) -> int:
    from opscope.engine.trace import runs

    if len(refs) != 2:
        raise ConfigError(f"`opscope trace diff` takes two saved trace runs (id or name), got {len(refs)}")
    (name_a, a), (name_b, b) = runs.load_summaries(refs, args.db)
    d = runs.diff(a, b)
    if args.json:
        print(json_output.dumps(d, indent=1, default=str))
    else:
        print(runs.render_diff(d, name_a, name_b), end="")
    return 0
