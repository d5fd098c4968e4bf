"""`opscope trace "prompt" --tokens 8 [--variant ...] [--out trace.json] [--jsonl events.jsonl] [--json]`
`opscope trace [--target cuda] [--telemetry MS] -- python SCRIPT [ARGS]` (or `-- python -m MODULE [ARGS]`)
`opscope trace diff A B` (engine.trace.script_cli)

Prints the placement report of one generation. ``--device meta`` loads the model on the CPU and
traces a stand-in copy on the meta device under FakeTensorMode: an accelerator's op stream and
placement (not its times or values) on a machine without one. With ``-- python SCRIPT [ARGS]``
(or ``-- python -m MODULE``) it traces your own script instead: its steps, placement and training
health, saved as a run; ``diff A B`` compares two saved script traces (docs/trace.md).
"""

from __future__ import annotations

import argparse
import re

from opscope.engine.cli import args as check
from opscope.engine.cli.commands.trace_script import add_script_args, cmd_diff, cmd_script, is_python
from opscope.engine.cli.common import add_model_args
from opscope.engine.core import json_output
from opscope.engine.core.errors import ConfigError

SIMULATED_DEVICES = ("meta",)
HOST_TARGET_NOTE = (
    "the target is the host (cpu), so a fallback to the CPU cannot show; run with "
    "--device meta to see placement as on an accelerator (simulated), or on a GPU"
)


def register(sub) -> None:
    from opscope.engine.trace.variants import CLEAN, VARIANTS

    p = sub.add_parser(
        "trace",
        help="trace every tensor op of a generation with its device; print the placement report",
        description=_plain(__doc__.split("\n\n")[1]),
        add_help=False,
    )
    p.add_argument("-h", "--help", action=_Help, help="show this help message and exit (`trace diff --help`: diff's)")
    p.add_argument(
        "prompt",
        nargs="*",
        type=check.utf8_text,
        default=None,
        help="the prompt; or `-- python SCRIPT [ARGS]` to trace your own script; or `diff A B`",
    )
    p.add_argument("--tokens", type=check.max_tokens, default=8, help="tokens to generate (greedy, EOS ignored)")
    add_model_args(p)
    p.add_argument("--variant", choices=VARIANTS, default=CLEAN, help="planted-bug model variant")
    p.add_argument("--out", type=check.output_path, default=None, help="write a Chrome trace / Perfetto JSON here")
    p.add_argument("--jsonl", type=check.output_path, default=None, help="write the raw events as JSON lines here")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument(
        "--source",
        choices=("off", "findings", "all"),
        default="findings",
        help="source lines: none, only for ops off the target (default), or for every op",
    )
    p.add_argument("--max-events", type=check.count, default=200_000, help="events stored (counts stay exact past it)")
    p.add_argument("--hooks", choices=("model", "global"), default="model", help="module-path hooks")
    add_script_args(p)
    p.set_defaults(func=cmd_trace)


def _plain(text: str) -> str:
    """A docstring's reST literals (double backquotes) as the CLI's other help quotes commands: `x`."""
    return re.sub(r"``(.+?)``", r"`\1`", text, flags=re.S)


DIFF_DESCRIPTION = (
    "Compare two script traces saved as runs (id or name): median step time, ops per step "
    "on and off the target, transfers and syncs per step, the modules whose time changed "
    "most, the last loss, and the findings only one of them has."
)


def diff_parser(parent: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """`opscope trace diff`'s own help (the words after `trace` are the prompt's to argparse)."""
    p = type(parent)(prog=f"{parent.prog} diff", description=DIFF_DESCRIPTION)
    p.add_argument("A", help="the baseline trace run (id or name)")
    p.add_argument("B", help="the trace run to compare with it")
    p.add_argument("--json", action="store_true", help="print the difference as JSON")
    return p


class _Help(argparse.Action):
    """-h/--help: `trace diff --help` shows diff's help, any other `trace --help` the whole command's."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        words = list(getattr(namespace, "prompt", None) or [])
        (diff_parser(parser) if words[:1] == ["diff"] else parser).print_help()
        parser.exit()


def _check(args) -> None:
    if args.tokens < 1:
        raise ConfigError(f"--tokens must be at least 1, got {args.tokens}")
    if args.max_events < 0:
        raise ConfigError(f"--max-events must be 0 or more, got {args.max_events}")
    for path in (args.out, args.jsonl):
        if path is not None and not path.parent.is_dir():
            raise ConfigError(f"cannot write {path}: folder {path.parent} does not exist")


def _options(args, target: str):
    from opscope.engine.trace.events import TraceOptions

    return TraceOptions(target=target, source=args.source, hooks=args.hooks, max_events=args.max_events)


def _load(args):
    from opscope.engine.cli.common import load_from_args

    device = str(args.device).strip().lower()
    simulate = device in SIMULATED_DEVICES
    if simulate:
        args.device = "cpu"  # the stand-in is built from the CPU model
    if getattr(args, "fastpath", "auto") == "auto":
        args.fastpath = "off"  # placement is about torch ops; the fused C++ decode step is opaque
    lm = load_from_args(args)
    return lm, (device if simulate else str(lm.device)), simulate


def cmd_trace(args) -> int:
    words = list(args.prompt or [])
    if words[:1] == ["diff"]:
        return cmd_diff(args, words[1:])
    if len(words) > 1 and is_python(words[0]):
        return cmd_script(args, words)
    args.prompt = " ".join(words) if words else "The capital of France is"
    return cmd_model_trace(args)


def cmd_model_trace(args) -> int:
    from opscope.engine.generation.generate import GenerationConfig
    from opscope.engine.trace.export import write_chrome_trace, write_jsonl
    from opscope.engine.trace.render import render_text
    from opscope.engine.trace.report import build_report
    from opscope.engine.trace.session import trace_generation

    _check(args)
    if (getattr(args, "backend", "torch") or "torch") != "torch":
        return cmd_backend_trace(args)
    lm, target, simulate = _load(args)
    config = GenerationConfig(max_tokens=args.tokens, ignore_eos=True)
    run = trace_generation(lm, args.prompt, config, _options(args, target), variant=args.variant, simulate=simulate)
    notes = run.notes + ([HOST_TARGET_NOTE] if target == "cpu" else [])
    report = build_report(run.result, notes)
    if args.out:
        write_chrome_trace(run.result, args.out, report.as_dict())
    if args.jsonl:
        write_jsonl(run.result, args.jsonl)
    if args.json:
        print(
            json_output.dumps(dict(report.as_dict(), variant=args.variant, simulated=simulate), indent=1, default=str)
        )
    else:
        print(render_text(report, title=f"{args.variant} model{' (simulated)' if simulate else ''}"), end="")
        for label, path in (("Chrome trace / Perfetto JSON", args.out), ("events (JSON lines)", args.jsonl)):
            if path:
                print(f"{label}: {path}")
    return 0


def cmd_backend_trace(args) -> int:
    """A plugin backend's model, traced through the backend's own op hook (engine.trace.backend_ops)."""
    from opscope.engine.backends import get_backend
    from opscope.engine.generation.generate import GenerationConfig
    from opscope.engine.trace import backend_ops
    from opscope.engine.trace.variants import CLEAN

    if args.variant != CLEAN or args.jsonl or str(args.device).strip().lower() in SIMULATED_DEVICES:
        raise ConfigError(
            f"--backend {args.backend}: planted variants, --jsonl and simulated devices trace torch "
            f"ops; use --backend torch for them"
        )
    backend = get_backend(args.backend)
    from opscope.engine.cli.common import load_from_args

    lm = load_from_args(args)
    config = GenerationConfig(max_tokens=args.tokens, ignore_eos=True)
    trace = backend_ops.trace_backend_generation(backend, lm, args.prompt, config, args.max_events)
    if args.out:
        backend_ops.write_chrome_trace(trace, args.out)
    if args.json:
        print(json_output.dumps(backend_ops.as_dict(trace), indent=1, default=str))
    else:
        print(backend_ops.render_text(trace), end="")
        if args.out:
            print(f"Chrome trace / Perfetto JSON: {args.out}")
    return 0
