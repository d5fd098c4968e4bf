"""Every bad flag fails while the command line is parsed: one line with the valid range, exit 2.

Each case names a model path that does not exist: had the flag got past the parser, the command
would have tried to open the model and printed that error instead, so the exact line also proves
that nothing was loaded. The installed `opscope` script's own code (app.cli.main) runs in this
process for most cases; a few go through the real script, as does whatever needs stdin or the
interpreter's traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from opscope.engine.bench.suites import SUITES

OPSCOPE = str(Path(sys.executable).parent / "opscope")
NEVER = "/nonexistent/never-opened.gguf"
CPUS = os.cpu_count()


def opscope(*args, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    argv = [OPSCOPE, *[a if isinstance(a, bytes) else str(a) for a in args]]
    return subprocess.run(argv, input=stdin, capture_output=True, timeout=120)


def one_line(r: subprocess.CompletedProcess) -> str:
    err = r.stderr.decode("utf-8", "replace")
    assert err.endswith("\n") and err.count("\n") == 1, err
    return err.rstrip("\n")


MODEL = ("--model", NEVER)
CASES = [
    (
        ("generate", "hi", *MODEL, "--threads", "0"),
        f"argument --threads: 0 is out of range: use 1…{CPUS} (the logical CPUs here)",
    ),
    (
        ("generate", "hi", *MODEL, "--threads", "100000"),
        f"argument --threads: 100000 is out of range: use 1…{CPUS} (the logical CPUs here)",
    ),
    (
        ("generate", "hi", *MODEL, "--threads", "-3"),
        f"argument --threads: -3 is out of range: use 1…{CPUS} (the logical CPUs here)",
    ),
    (
        ("generate", "hi", *MODEL, "--threads", "two"),
        f"argument --threads: 'two' is not a whole number: use 1…{CPUS} (the logical CPUs here)",
    ),
    (
        ("generate", "hi", *MODEL, "--temperature", "inf"),
        "argument --temperature/-t: inf is out of range: use a finite number ≥ 0 (0 = greedy)",
    ),
    (
        ("generate", "hi", *MODEL, "-t", "nan"),
        "argument --temperature/-t: nan is out of range: use a finite number ≥ 0 (0 = greedy)",
    ),
    (
        ("generate", "hi", *MODEL, "--temperature", "-0.5"),
        "argument --temperature/-t: -0.5 is out of range: use a finite number ≥ 0 (0 = greedy)",
    ),
    (("generate", "hi", *MODEL, "--seed", "-1"), "argument --seed: -1 is out of range: use 0…4294967295"),
    (("generate", "hi", *MODEL, "--top-p", "0"), "argument --top-p: 0 is out of range: use a finite number (0, 1]"),
    (("generate", "hi", *MODEL, "--top-p", "1.5"), "argument --top-p: 1.5 is out of range: use a finite number (0, 1]"),
    (("generate", "hi", *MODEL, "--top-k", "-1"), "argument --top-k: -1 is out of range: use 0…1000000 (0 = off)"),
    (("generate", "hi", *MODEL, "--min-p", "1"), "argument --min-p: 1 is out of range: use a finite number [0, 1)"),
    (("generate", "hi", *MODEL, "--max-tokens", "0"), "argument --max-tokens/-n: 0 is out of range: use 1…1000000"),
    (
        ("generate", "hi", *MODEL, "--repetition-penalty", "0"),
        "argument --repetition-penalty: 0 is out of range: use a finite number > 0 (1 = off)",
    ),
    (
        ("chat", *MODEL, "--temperature", "inf"),
        "argument --temperature/-t: inf is out of range: use a finite number ≥ 0 (0 = greedy)",
    ),
    (("chat", *MODEL, "--seed", "-1"), "argument --seed: -1 is out of range: use 0…4294967295"),
    (("trace", "hi", *MODEL, "--tokens", "0"), "argument --tokens: 0 is out of range: use 1…1000000"),
    (
        ("trace", "hi", *MODEL, "--threads", "0"),
        f"argument --threads: 0 is out of range: use 1…{CPUS} (the logical CPUs here)",
    ),
    (("bench", "llm", *MODEL, "--repeat", "0"), "argument --repeat: 0 is out of range: use 1…1000000"),
    (("bench", "llm", *MODEL, "--warmup", "-1"), "argument --warmup: -1 is out of range: use 0…1000000"),
    (
        ("bench", "llm", *MODEL, "--min-time", "inf"),
        "argument --min-time: inf is out of range: use a finite number 0…86400 (seconds)",
    ),
    (
        ("bench", "llm", *MODEL, "--telemetry", "5"),
        "argument --telemetry: 5 is out of range: use a finite number 20…60000",
    ),
    (
        ("bench", "llm", *MODEL, "--threads", "100000"),
        f"argument --threads: 100000 is out of range: use 1…{CPUS} (the logical CPUs here)",
    ),
    (("bench", "llm", *MODEL, "--param", "tg=-1"), "--param tg: -1 is out of range: use a whole number ≥ 1"),
    (
        ("bench", "batch", *MODEL, "--param", "batches=1,0"),
        "--param batches: 0 is out of range: use a whole number ≥ 1",
    ),
    (("bench", "llm", *MODEL, "--param", "depths=0,-5"), "--param depths: -5 is out of range: use a whole number ≥ 0"),
    (("bench", "nope"), f"argument SUITE: invalid choice: 'nope' (choose from {', '.join(SUITES)})"),
    (("runs", "list", "--limit", "0"), "argument --limit: 0 is out of range: use a whole number ≥ 1"),
    (
        ("runs", "list", "--status", "done"),
        "argument --status: invalid choice: 'done' (choose from running, completed, failed, aborted)",
    ),
    (
        ("runs", "compare", "--alpha", "2"),
        "argument --alpha: the significance level must be between 0 and 1, e.g. 0.05",
    ),
    (("monitor", "--interval", "1"), "argument --interval: 1 is out of range: use a finite number 20…60000"),
    (("monitor", "--duration", "-1"), "argument --duration: -1 is out of range: use a finite number > 0"),
    (("gui", "--theme", "x"), "argument --theme: invalid choice: 'x' (choose from system, light, dark)"),
    (("generate", "hi", *MODEL, "--nope"), "unrecognized arguments: --nope"),
    (("generate",), "the following arguments are required: prompt"),
    (
        ("nosuchcommand",),
        "argument COMMAND: invalid choice: 'nosuchcommand' (choose from gui, generate, chat, models, ",
    ),
]


@pytest.mark.parametrize("argv,line", CASES, ids=[" ".join(c[0][:1] + c[0][-2:]) for c in CASES])
def test_bad_flag_is_one_line_before_anything_loads(capsys, argv, line):
    """The parser's own checks, run in this process (_main_line: exit code, one line on stderr,
    nothing on stdout); REAL_PROCESS below shows the installed script prints the same."""
    code, printed = _main_line(capsys, argv, script=True)
    assert code == 2
    if line.endswith(" "):  # the list of every command is long: its start is enough
        assert printed.startswith(f"opscope: error: {line}")
    else:
        assert printed == f"opscope: error: {line}"


# Through the installed `opscope` script: a flag's range, a choice, and a command word.
REAL_PROCESS = [CASES[0], CASES[-1], next(c for c in CASES if c[0][:2] == ("bench", "llm"))]


@pytest.mark.parametrize("argv,line", REAL_PROCESS, ids=[" ".join(c[0][:1] + c[0][-2:]) for c in REAL_PROCESS])
def test_bad_flag_is_one_line_from_the_installed_script(argv, line):
    r = opscope(*argv)
    assert r.returncode == 2
    printed = one_line(r)
    if line.endswith(" "):
        assert printed.startswith(f"opscope: error: {line}")
    else:
        assert printed == f"opscope: error: {line}"
    assert r.stdout == b""


def test_non_utf8_prompt_in_argv_is_one_line():
    r = opscope("generate", b"ab\xff\xfe", *MODEL)
    assert r.returncode == 2
    assert one_line(r) == (
        "opscope: error: argument prompt: not valid UTF-8 text (byte 0xff at character 2): pass the text in UTF-8"
    )


def test_non_utf8_prompt_on_stdin_is_one_line():
    r = opscope("generate", "-", *MODEL, stdin=b"caf\xe9 au lait")  # Latin-1, not UTF-8
    assert r.returncode == 2
    assert one_line(r) == (
        "opscope: error: the prompt on stdin is not valid UTF-8 (byte 0xe9 at offset 3): pass the text in UTF-8"
    )


def test_a_good_stdin_prompt_reaches_the_model_loader():
    """The counterpart: valid UTF-8 on stdin passes, and the next thing to fail is the model path."""
    r = opscope("generate", "-", *MODEL, stdin="café".encode())
    assert r.returncode == 2 and NEVER in one_line(r)


# --- global flags before or after the sub-command ---------------------------------------------


@pytest.mark.parametrize("where", ["before", "after"])
def test_db_flag_before_or_after_the_command(tmp_path, where):
    db = tmp_path / "elsewhere" / "runs.sqlite"
    argv = ["--db", db, "runs", "list"] if where == "before" else ["runs", "list", "--db", db]
    r = opscope(*argv)
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode() == f"no saved runs: no run store at {db} yet (`opscope bench SUITE` creates it)\n"
    assert not db.parent.exists()  # reading creates nothing


def test_db_flag_after_a_nested_command_wins_over_the_one_before(tmp_path):
    first, second = tmp_path / "a.sqlite", tmp_path / "b.sqlite"
    r = opscope("--db", first, "runs", "list", "--db", second)
    assert str(second) in r.stdout.decode() and str(first) not in r.stdout.decode()


def test_debug_flag_before_the_command_shows_the_traceback():
    r = opscope("--debug", "generate", "hi", *MODEL)
    assert r.returncode != 0 and b"Traceback (most recent call last)" in r.stderr


@pytest.mark.parametrize("argv", [["generate", "hi", *MODEL, "--debug"], ["models", "inspect", NEVER, "--debug"]])
def test_debug_flag_after_the_command_lets_the_error_through_to_its_traceback(argv):
    """In this process: with --debug the error leaves main() instead of becoming one line (the
    interpreter prints its traceback, as the real process above shows)."""
    from opscope.app.cli import main
    from opscope.engine.core.errors import EngineError

    with pytest.raises(EngineError, match=NEVER):
        main(argv)


def test_without_debug_the_same_error_is_one_line(capsys):
    code, line = _main_line(capsys, ["generate", "hi", *MODEL], script=True)
    assert code == 2 and NEVER in line


def test_help_still_lists_the_global_flags_on_a_command():
    r = opscope("bench", "--help")
    assert r.returncode == 0 and b"--db URL" in r.stdout and b"--debug" in r.stdout


# --- in-process: every value checked while parsing, or before a store or model is opened ----------


def _main_line(capsys, argv, script: bool = False) -> tuple[int, str]:
    """engine.cli.main in this process (``script``: app.cli.main, what the installed `opscope`
    runs, with `gui` among its commands): its exit code and its one line on stderr."""
    if script:
        from opscope.app.cli import main
    else:
        from opscope.engine.cli.main import main

    capsys.readouterr()
    try:
        code = main([str(a) for a in argv])
    except SystemExit as e:  # a bad flag: argparse's exit, after our one line
        code = e.code
    out, err = capsys.readouterr()
    assert out == "" and err.endswith("\n") and err.count("\n") == 1, (out, err)
    return code, err.rstrip("\n")


IN_PROCESS = [
    (
        ("generate", "hi", *MODEL, "--top-k", "99999999999"),
        "argument --top-k: 99999999999 is out of range: use 0…1000000 (0 = off)",
    ),
    (("generate", "hi", *MODEL, "--stop", ""), "argument --stop: empty: give the text that ends the reply"),
    (("chat", *MODEL, "--stop", "  "), "argument --stop: empty: give the text that ends the reply"),
    (("--db", "", "runs", "list"), "argument --db: empty: give a SQLAlchemy URL or a SQLite file path"),
    (
        ("bench", "llm", *MODEL, "--name", "123"),
        "argument --name: '123' is all digits and would read as a run id: add a letter",
    ),
    (
        ("bench", "llm", *MODEL, "--name", " x"),
        "argument --name: ' x' is not a run name: use 1…200 characters, no leading or trailing spaces",
    ),
    (("bench", "llm", *MODEL, "--repeat", "10000000"), "argument --repeat: 10000000 is out of range: use 1…1000000"),
    (("bench", "llm", *MODEL, "--warmup", "10000000"), "argument --warmup: 10000000 is out of range: use 0…1000000"),
    (
        ("bench", "llm", *MODEL, "--min-time", "1e9"),
        "argument --min-time: 1e9 is out of range: use a finite number 0…86400 (seconds)",
    ),
    (
        ("runs", "compare", "--fail-on-regression", "inf"),
        "argument --fail-on-regression: inf is out of range: use a finite number ≥ 0 (percent)",
    ),
    (
        ("runs", "compare", "--fail-on-regression", "-1"),
        "argument --fail-on-regression: -1 is out of range: use a finite number ≥ 0 (percent)",
    ),
    (("trace", "hi", *MODEL, "--tokens", "100000000"), "argument --tokens: 100000000 is out of range: use 1…1000000"),
    (
        ("trace", *MODEL, "--telemetry", "nan", "--", "python", "x.py"),
        "argument --telemetry: nan is out of range: use a finite number 20…60000",
    ),
    (
        ("trace", "--report", "/nonexistent/dir/r.json", "--", "python", "x.py"),
        "argument --report: /nonexistent/dir/r.json: its folder /nonexistent/dir does not exist: create it first",
    ),
    (
        ("runs", "export", "1", "-o", "/nonexistent/dir/run.json"),
        "argument -o/--output: /nonexistent/dir/run.json: its folder /nonexistent/dir does not exist: create it first",
    ),
]


@pytest.mark.parametrize("argv,line", IN_PROCESS, ids=[" ".join(c[0][:1] + c[0][-2:]) for c in IN_PROCESS])
def test_bad_value_is_one_line_in_process(capsys, argv, line):
    assert _main_line(capsys, argv) == (2, f"opscope: error: {line}")


@pytest.mark.parametrize(
    "argv",
    [
        ("runs", "compare", "-o", "{dir}"),
        ("runs", "roofline", "1", "--out", "{dir}"),
        ("bench", "llm", *MODEL, "--trace-out", "{dir}"),
        ("trace", "hi", *MODEL, "--jsonl", "{dir}"),
    ],
)
def test_an_output_path_that_is_a_folder_is_refused_while_parsing(capsys, tmp_path, argv):
    argv = [a.format(dir=tmp_path) for a in argv]
    flag = {"-o": "-o/--output"}.get(argv[-2], argv[-2])
    assert _main_line(capsys, [*argv, "--db", tmp_path / "runs.sqlite"]) == (
        2,
        f"opscope: error: argument {flag}: {tmp_path} is a folder: give a file name, e.g. {tmp_path / 'out'}",
    )
    assert list(tmp_path.iterdir()) == []  # no store was created either


@pytest.mark.parametrize(
    "suite,param,line",
    [
        ("matmul", "dtypes=float32,float99", "--param dtypes: 'float99' is not one of float32, bfloat16, float16"),
        ("scaling", "models=gpt9", "--param models: 'gpt9' is not one of gpt2-small, gpt2-medium, gpt2-large, gpt2-xl"),
    ],
)
def test_a_suite_parameter_outside_its_choices_is_one_line_before_a_store_is_created(
    capsys, tmp_path, suite, param, line
):
    db = tmp_path / "runs.sqlite"
    assert _main_line(capsys, ["bench", suite, "--quick", "--param", param, "--db", db]) == (
        2,
        f"opscope: error: {line}",
    )
    assert not db.exists()


def test_pushing_a_missing_run_creates_no_target_store(capsys, tmp_path):
    from opscope.engine.core.results import RunResult
    from opscope.engine.store import RunStore

    src, target = tmp_path / "src.sqlite", tmp_path / "team" / "target.sqlite"
    with RunStore.open(src) as s:
        s.save(RunResult(kind="matmul", name="first"))
    assert _main_line(capsys, ["runs", "push", "first", "999", "--to", target, "--db", src]) == (
        2,
        f"opscope: error: no saved run with id 999 in sqlite:///{src} (`opscope runs list` shows the saved runs)",
    )
    assert not target.parent.exists()


@pytest.mark.parametrize("tag", ["", " x"])
def test_a_blank_or_padded_tag_is_refused_by_the_store_and_while_parsing(capsys, tmp_path, tag):
    from opscope.engine.core.results import RunResult
    from opscope.engine.store import RunStore

    db = tmp_path / "runs.sqlite"
    with RunStore.open(db) as s:
        s.save(RunResult(kind="matmul", name="first"))
    assert _main_line(capsys, ["runs", "tag", "first", tag, "--db", db]) == (
        2,
        f"opscope: error: tag {tag!r} is not valid: give some text without leading or trailing spaces",
    )
    assert _main_line(capsys, ["bench", "matmul", "--tag", tag, "--db", db]) == (
        2,
        f"opscope: error: argument --tag: {tag!r} is not a tag: give some text without leading or trailing spaces",
    )
    with RunStore.open(db) as s:
        assert s.info("first").tags == ()
