"""`opscope runs ...`: list, show, compare, roofline, delete, tag, rename, notes, export, push saved runs.

Runs are addressed by id or unique name. The database is the root parser's ``--db`` (default: see
engine.store.db). ``runs compare`` with no runs compares the two latest completed runs of the same
kind, oldest first, so ``opscope bench llm; opscope bench llm --dtype bfloat16; opscope runs compare``
just works. Exit codes: 0 done, 1 a significant regression beyond --fail-on-regression, 2 user error,
3 (with --fail-on-regression, and no regression found) a change for the worse beyond the threshold
that the sample counts cannot test: too few repetitions to tell, which a gate must not pass.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from opscope.engine.cli.args import output_file, percent, positive_int
from opscope.engine.core import json_output
from opscope.engine.core.errors import ConfigError
from opscope.engine.store.access import open_store

REGRESSION_EXIT_CODE = 1
UNDECIDED_EXIT_CODE = 3


def _open_store(args: argparse.Namespace):
    return open_store(getattr(args, "db", None))


def _write(text: str, output: str | None) -> None:
    if output:
        try:
            Path(output).write_text(text, encoding="utf-8")
        except OSError as e:
            import errno

            full = e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
            raise ConfigError(
                f"cannot write {output}: {e.strerror or e}{' — free some disk space and retry' if full else ''}"
            ) from e
    else:
        sys.stdout.write(text)


def cmd_list(args: argparse.Namespace) -> int:
    from opscope.engine.store.db import StoreMissingError
    from opscope.engine.store.views import list_dicts, list_text

    try:
        store = _open_store(args)
    except StoreMissingError as e:  # reading creates nothing: say where the runs would be
        note = f"no saved runs: no run store at {e.path} yet (`opscope bench SUITE` creates it)"
        _write("[]\n" if args.format == "json" else note + "\n", None)
        if args.format == "json":
            print(note, file=sys.stderr)
        return 0
    with store:
        runs = store.list(kind=args.kind, status=args.status, tag=args.tag, name_contains=args.name, limit=args.limit)
    _write(json_output.dumps(list_dicts(runs), indent=2) + "\n" if args.format == "json" else list_text(runs), None)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from opscope.engine.store.convert import export_json
    from opscope.engine.store.views import show_text

    with _open_store(args) as store:
        run = store.load(args.run)
    _write(export_json(run) + "\n" if args.format == "json" else show_text(run), None)
    return 0


def _default_pair(store) -> list[int]:
    latest = store.list(status="completed", limit=1)
    if not latest:
        raise ConfigError(f"no completed runs in {store.display_url} to compare; run `opscope bench SUITE` first")
    same_kind = store.list(status="completed", kind=latest[0].kind, limit=2)
    if len(same_kind) < 2:
        raise ConfigError(
            f"only one completed {latest[0].kind!r} run in {store.display_url}; "
            f"name the runs to compare: `opscope runs compare A B`"
        )
    return [same_kind[1].id, same_kind[0].id]


def cmd_compare(args: argparse.Namespace) -> int:
    from opscope.engine.store.compare import compare
    from opscope.engine.store.render import render

    if len(args.runs) == 1:
        raise ConfigError("compare needs two or more runs (or none: the two latest runs of the same kind)")
    with _open_store(args) as store:
        refs = args.runs or _default_pair(store)
        cmp = compare([store.load(ref) for ref in refs], alpha=args.alpha)
    _write(render(cmp, args.format), args.output)
    if args.fail_on_regression is None:
        return 0
    return _gate(cmp, args.fail_on_regression)


def _gate(cmp, threshold_pct: float) -> int:
    """The verdict of --fail-on-regression on stderr, and its exit code."""
    found, undecided = cmp.regressions(threshold_pct), cmp.undecided(threshold_pct)
    sys.stdout.flush()  # the table first, then the verdict, even through a pipe
    for reg in found:
        print(
            f"regression: {reg.row.label} in {cmp.runs[reg.run_index].name!r}: {reg.delta.delta_pct:+.2f}% "
            f"vs {cmp.runs[0].name!r} (p={reg.delta.p_value:.3f}, limit {threshold_pct:g}%)",
            file=sys.stderr,
        )
    for reg in undecided:
        d = reg.delta
        print(
            f"undecided: {reg.row.label} in {cmp.runs[reg.run_index].name!r}: {d.delta_pct:+.2f}% "
            f"vs {cmp.runs[0].name!r}, but n={d.n_base}+{d.n_other} cannot reach p <= {cmp.alpha:g} "
            f"(need >= {d.need_per_side} per side: rerun with --repeat {max(5, d.need_per_side)})",
            file=sys.stderr,
        )
    if found:
        return REGRESSION_EXIT_CODE
    return UNDECIDED_EXIT_CODE if undecided else 0


def cmd_delete(args: argparse.Namespace) -> int:
    with _open_store(args) as store:
        ids = [store.resolve(ref) for ref in args.runs]  # all must exist before any is deleted
        for run_id in dict.fromkeys(ids):
            info = store.delete(run_id)
            print(f"deleted run #{info.id} {info.name}")
    return 0


def cmd_tag(args: argparse.Namespace) -> int:
    with _open_store(args) as store:
        info = store.tag(args.run, remove=args.tags) if args.remove else store.tag(args.run, add=args.tags)
    print(f"run #{info.id} {info.name}: tags {', '.join(info.tags) or '(none)'}")
    return 0


def cmd_rename(args: argparse.Namespace) -> int:
    with _open_store(args) as store:
        info = store.rename(args.run, args.new_name)
    print(f"run #{info.id} is now named {info.name}")
    return 0


def cmd_notes(args: argparse.Namespace) -> int:
    with _open_store(args) as store:
        info = store.set_notes(args.run, args.text)
    print(f"run #{info.id} {info.name}: notes saved")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from opscope.engine.store.convert import export_csv, export_json

    with _open_store(args) as store:
        run = store.load(args.run)
    _write(export_csv(run) if args.format == "csv" else export_json(run) + "\n", args.output)
    return 0


def cmd_roofline(args: argparse.Namespace) -> int:
    from opscope.engine.bench.ceilings import roofline

    with _open_store(args) as store:
        roof = roofline.from_run(store.load(args.run).result, store, probe=True)
    notes = _draw_roofline(roofline, roof, args.out) if args.out else []
    _write(json_output.dumps(roof.as_dict(), indent=2) + "\n" if args.format == "json" else roofline.text(roof), None)
    for note in notes:
        print(note, file=sys.stderr)
    return 0


def _draw_roofline(roofline, roof, out: str) -> list[str]:
    """``--out``: FILE.svg or FILE.png as named; a name without an extension gets FILE.svg always and
    FILE.png where matplotlib is installed (as the help says). The lines to print once it is done."""
    suffix = Path(out).suffix.lower()
    if suffix not in ("", ".svg", ".png"):
        raise ConfigError(f"--out {out}: give a .svg or .png file name, or a name without an extension for both")
    if suffix == ".png":
        roofline.png(roof, out)
        return [f"wrote {out}"]
    svg_path = out if suffix == ".svg" else out + ".svg"
    _write(roofline.svg(roof), svg_path)
    notes = [f"wrote {svg_path}"]
    if suffix == "":
        try:
            roofline.png(roof, out + ".png")
            notes.append(f"wrote {out}.png")
        except ConfigError:  # matplotlib missing: the SVG is the drawing, say why there is no PNG
            notes.append(f"{out}.png not written: PNG needs matplotlib (pip install matplotlib)")
    return notes


def cmd_push(args: argparse.Namespace) -> int:
    from opscope.engine.store.push import push_runs

    with _open_store(args) as source:
        for ref in args.runs:  # a run that is not there fails before the target store is created
            source.resolve(ref)
        with open_store(args.to, write=True) as target:
            report = push_runs(source, args.runs, target)
    for line in report.lines():
        print(line)
    print(report.summary())
    return 0


def _alpha(text: str) -> float:
    try:
        value = float(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from e
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError("the significance level must be between 0 and 1, e.g. 0.05")
    return value


def _add_manage(sub) -> None:
    p = sub.add_parser("delete", help="delete saved runs")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run id or name")
    p.set_defaults(func=cmd_delete)
    p = sub.add_parser("tag", help="add (or --remove) tags on a run")
    p.add_argument("run", metavar="RUN")
    p.add_argument("tags", nargs="+", metavar="TAG")  # checked by the store when added: any can be removed
    p.add_argument("--remove", action="store_true", help="remove these tags instead")
    p.set_defaults(func=cmd_tag)
    p = sub.add_parser("rename", help="give a run a new unique name")
    p.add_argument("run", metavar="RUN")
    p.add_argument("new_name", metavar="NEW_NAME")
    p.set_defaults(func=cmd_rename)
    p = sub.add_parser("notes", help="set a run's notes")
    p.add_argument("run", metavar="RUN")
    p.add_argument("text", metavar="TEXT")
    p.set_defaults(func=cmd_notes)
    p = sub.add_parser("export", help="write one run with all its raw data (json or csv)")
    p.add_argument("run", metavar="RUN")
    p.add_argument("--format", choices=("json", "csv"), default="json")
    p.add_argument("-o", "--output", type=output_file, metavar="FILE", help="write here instead of stdout")
    p.set_defaults(func=cmd_export)
    p = sub.add_parser(
        "push",
        help="copy runs to another store (a team's PostgreSQL URL or SQLite file)",
        description="Copy runs, with all their data, names and times, from this store (--db) "
        "to the store at --to. Runs whose name the target already has are skipped.",
    )
    p.add_argument("runs", nargs="*", metavar="RUN", help="run ids or names (default: every finished run)")
    p.add_argument(
        "--to",
        required=True,
        metavar="URL",
        help="target store: postgresql+psycopg://user@host/db, sqlite:///path or a file path",
    )
    p.set_defaults(func=cmd_push)


def _add_compare(sub) -> None:
    p = sub.add_parser(
        "compare",
        help="compare runs with statistics (first = baseline)",
        description="Per metric: median ± 95% CI, change vs the first run, Mann-Whitney U "
        "p-value ('~' when p > alpha; 'n too small to decide' when the sample "
        "counts cannot reach alpha), a geomean per unit, and what differs.",
    )
    p.add_argument(
        "runs",
        nargs="*",
        metavar="RUN",
        help="two or more run ids or names; none: the two latest completed runs of the same kind",
    )
    p.add_argument("--format", choices=("text", "markdown", "csv", "json"), default="text")
    p.add_argument("--alpha", type=_alpha, default=0.05, help="significance level (default 0.05)")
    p.add_argument(
        "--fail-on-regression",
        type=percent,
        metavar="PCT",
        help=f"exit {REGRESSION_EXIT_CODE} when a metric gets significantly worse by more than PCT%%; "
        f"exit {UNDECIDED_EXIT_CODE} when a change that large has too few samples to be tested",
    )
    p.add_argument("-o", "--output", type=output_file, metavar="FILE", help="write here instead of stdout")
    p.set_defaults(func=cmd_compare)


def register(subparsers) -> None:
    runs = subparsers.add_parser("runs", help="list, show, compare and manage saved runs")
    sub = runs.add_subparsers(dest="runs_command", metavar="COMMAND", required=True)
    p = sub.add_parser("list", help="list saved runs, newest first")
    p.add_argument("--kind", help="only runs of this suite")
    p.add_argument("--status", choices=("running", "completed", "failed", "aborted"))
    p.add_argument("--tag", help="only runs with this tag")
    p.add_argument("--name", help="only runs whose name contains this")
    p.add_argument("--limit", type=positive_int, help="at most this many")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=cmd_list)
    p = sub.add_parser("show", help="one run: metrics with statistics, settings, fingerprint")
    p.add_argument("run", metavar="RUN", help="run id or name")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=cmd_show)
    p = sub.add_parser(
        "roofline", help="an llm/matmul/attention run's points against the compute and bandwidth ceilings (FLOP/byte)"
    )
    p.add_argument("run", metavar="RUN", help="run id or name")
    p.add_argument(
        "--out",
        type=output_file,
        metavar="FILE",
        help="also draw it: FILE.svg or FILE.png; a name without an extension writes FILE.svg "
        "and, where matplotlib is installed, FILE.png",
    )
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=cmd_roofline)
    _add_compare(sub)
    _add_manage(sub)
