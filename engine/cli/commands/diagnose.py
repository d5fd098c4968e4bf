"""`opscope diagnose [--model FILE ...] [--prompt-tokens N] [--tokens N]`
`opscope diagnose [--target cuda] -- python SCRIPT [ARGS]` (or `-- python -m MODULE [ARGS]`)
`opscope diagnose diff A B`

Why is it slow? A short, bounded measurement of a model (a prefill and a few dozen decode steps) or
of your own script, with the trace, the telemetry sampler and the compute and bandwidth ceilings on,
read by a table of rules: at most ~10 lines, most important first, each finding with its evidence,
its place (module path, file:line), the fix and the expected gain. Saved as a run of kind
`diagnosis`; `diff A B` says which findings went away and what bounds the work now (docs/diagnose.md).
"""

from __future__ import annotations

from pathlib import Path

from opscope.engine.cli import args as check
from opscope.engine.cli.common import add_model_args
from opscope.engine.core import json_output
from opscope.engine.core.errors import ConfigError

SIMULATED_DEVICES = ("meta",)


def register(sub) -> None:
    from opscope.engine.trace.variants import CLEAN, VARIANTS

    p = sub.add_parser(
        "diagnose",
        help="why is it slow: the bound, the culprit line, the fix and the gain",
        description=__doc__.split("\n\n")[1].replace("\n", " "),
    )
    p.add_argument(
        "words",
        nargs="*",
        type=check.utf8_text,
        metavar="-- python SCRIPT [ARGS] | diff A B",
        help="your own script after `--`; or `diff A B` (two saved diagnoses)",
    )
    add_model_args(p)
    g = p.add_argument_group("what runs")
    g.add_argument("--prompt", type=check.utf8_text, default=None, help="prompt text (default: synthetic ids)")
    g.add_argument("--prompt-tokens", type=check.max_tokens, default=32, help="synthetic prompt length (prefill)")
    g.add_argument("--tokens", type=check.max_tokens, default=32, help="decode steps timed (≥ 2)")
    g.add_argument("--trace-tokens", type=check.max_tokens, default=4, help="decode steps traced (≥ 2)")
    g.add_argument("--variant", choices=VARIANTS, default=CLEAN, help="planted-bug model variant")
    g.add_argument("--target", default=None, help="a script's device (default: cuda when available, else cpu)")
    g.add_argument("--cwd", default=None, help="working directory for the script")
    o = p.add_argument_group("output")
    o.add_argument(
        "--telemetry",
        type=check.telemetry_interval_ms(),
        default=100.0,
        metavar="MS",
        help="telemetry sampling interval in ms (saved with the run)",
    )
    o.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    o.add_argument("--markdown", type=check.output_path, default=None, metavar="FILE", help="also write it as Markdown")
    o.add_argument("--name", default="", help="name of the saved run (default: diagnosis-DATE-TIME)")
    o.add_argument("--no-save", action="store_true", help="do not save the diagnosis in the run store")
    p.set_defaults(func=cmd_diagnose)


def cmd_diagnose(args) -> int:
    from opscope.engine.trace.script import _is_python

    words = list(args.words or [])
    if words[:1] == ["diff"]:
        return cmd_diff(args, words[1:])
    if args.markdown is not None and not Path(args.markdown).parent.is_dir():
        raise ConfigError(f"cannot write {args.markdown}: folder {Path(args.markdown).parent} does not exist")
    if words and _is_python(words[0]):
        return _script(args, words)
    if words:
        raise ConfigError(f"unexpected {' '.join(words)!r}: give `-- python SCRIPT [ARGS]` or `diff A B`")
    return _model(args)


def _model(args) -> int:
    from opscope.engine.cli.common import load_from_args
    from opscope.engine.diagnose.measure import ModelPlan
    from opscope.engine.diagnose.session import diagnose_model

    if args.tokens < 2 or args.trace_tokens < 2:
        raise ConfigError("--tokens and --trace-tokens must be at least 2 (a prefill, then decode steps)")
    simulate = str(args.device).strip().lower() in SIMULATED_DEVICES
    if simulate:
        args.device = "cpu"  # the stand-in is built from the CPU model
    if args.fastpath == "auto":
        args.fastpath = "off"  # the trace sees torch ops; the fused C++ decode step is opaque
    lm = load_from_args(args)
    if not hasattr(lm, "model"):
        raise ConfigError(f"--backend {args.backend}: diagnose needs a torch model (use --backend torch)")
    plan = ModelPlan(
        args.prompt, args.prompt_tokens, args.tokens, args.trace_tokens, args.variant, simulate, args.dtype
    )
    subject = str(args.model or lm.source.path)
    d, run = diagnose_model(
        lm, plan, Path(subject).name, args.telemetry, {"model": subject, "dtype": args.dtype, "fastpath": args.fastpath}
    )
    _emit(args, d, run)
    return 0


def _script(args, words: list[str]) -> int:
    from opscope.engine.diagnose.session import diagnose_script
    from opscope.engine.trace.script import parse_command

    if args.cwd is not None and not Path(args.cwd).is_dir():
        raise ConfigError(f"--cwd {args.cwd}: no such folder")
    spec = parse_command(words, args.cwd)
    target = (args.target or _default_target()).strip().lower()
    d, run, code = diagnose_script(spec, target, args.telemetry)
    print("\n" + "=" * 24 + f" opscope diagnose: {spec.label} " + "=" * 24)
    _emit(args, d, run)
    return code


def _default_target() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _emit(args, d, run) -> None:
    from opscope.engine.diagnose.report import render_markdown, render_text

    if args.json:
        print(json_output.dumps(d.summary(), indent=1, default=str))
    else:
        print(render_text(d), end="")
    if args.markdown:
        Path(args.markdown).write_text(render_markdown(d))
        print(f"Markdown: {args.markdown}")
    if not args.no_save:
        from opscope.engine.trace.runs import save

        run.name = args.name
        run_id, name = save(run, args.db)
        print(f"saved as run {run_id} ({name}); compare two with `opscope diagnose diff A B`")


def cmd_diff(args, refs: list[str]) -> int:
    from opscope.engine.diagnose.report import diff, render_diff
    from opscope.engine.diagnose.session import load_summaries

    if len(refs) != 2:
        raise ConfigError(f"`opscope diagnose diff` takes two saved diagnoses (id or name), got {len(refs)}")
    (name_a, a), (name_b, b) = load_summaries(refs, args.db)
    d = diff(a, b)
    if args.json:
        print(json_output.dumps(d, indent=1, default=str))
    else:
        print(render_diff(d, name_a, name_b), end="")
    return 0
