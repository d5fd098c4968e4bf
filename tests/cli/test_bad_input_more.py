"""Issue 19, bad command lines found by the audit: each gets one line and exit 2 before anything is
loaded, sampled or created (in-process through opscope.engine.cli.main)."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest
from opscope.engine.cli import args as cli_args
from opscope.engine.cli.main import main
from opscope.engine.core import results
from opscope.engine.store import runstore


def _err_lines(capsys) -> list[str]:
    return capsys.readouterr().err.splitlines()


def test_monitor_pid_without_a_process_is_one_line_before_sampling(capsys):
    code = main(["monitor", "--pid", "999999999", "--interval", "50", "--duration", "1", "--json"])
    out, err = capsys.readouterr()
    assert code == 2
    assert err.splitlines() == [
        "opscope: error: --pid 999999999: no such process: give the id of a running process (see ps)"
    ]
    assert out == ""  # not one sample


def test_monitor_ends_when_the_watched_process_exits(capsys):
    child = subprocess.Popen(["sleep", "0.5"])  # left unreaped while monitored: a zombie once it exits
    try:
        code = main(["monitor", "--pid", str(child.pid), "--interval", "50", "--duration", "5"])
    finally:
        child.wait()
    out, err = capsys.readouterr()
    assert code == 0
    assert err.splitlines() == [f"opscope: process {child.pid} exited; monitor stopped"]  # no WARNING before it


def test_bench_model_that_does_not_exist_fails_before_the_store_is_created(tmp_path, capsys):
    db = tmp_path / "runs.db"
    model = tmp_path / "nope.gguf"
    code = main(["bench", "llm", "--quick", "--model", str(model), "--db", str(db)])
    assert code == 2
    assert _err_lines(capsys) == [
        f"opscope: error: {model}: no such file or directory; give a .gguf file or a Hugging Face model directory"
    ]
    assert not db.exists()


def test_bench_model_directory_without_a_model_fails_before_the_store_is_created(tmp_path, capsys):
    db = tmp_path / "runs.db"
    model = tmp_path / "empty"
    model.mkdir()
    code = main(["bench", "llm", "--quick", "--model", str(model), "--db", str(db)])
    assert code == 2
    assert _err_lines(capsys) == [
        f"opscope: error: {model}: directory holds no model (no config.json, *.safetensors or *.gguf)"
    ]
    assert not db.exists()


def test_generate_refuses_an_empty_prompt_naming_the_argument(capsys):
    with pytest.raises(SystemExit) as e:  # refused while parsing, before the model is even looked at
        main(["generate", "", "--model", "/nonexistent/never-loaded.gguf"])
    assert e.value.code == 2
    assert _err_lines(capsys) == [
        "opscope: error: argument prompt: empty: give the prompt's text, or - to read it from stdin"
    ]


def test_generate_refuses_an_empty_prompt_on_stdin(monkeypatch, capsys, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with empty.open("rb") as f:
        monkeypatch.setattr("sys.stdin", type("Stdin", (), {"buffer": f})())
        code = main(["generate", "-", "--model", "/nonexistent/never-loaded.gguf"])
    assert code == 2
    assert _err_lines(capsys) == ["opscope: error: the prompt on stdin is empty: pipe the prompt's text in"]


def test_run_name_limit_is_one_constant_the_store_imports():
    tree = ast.parse(Path(runstore.__file__).read_text())
    imported = {
        (node.module, a.name) for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) for a in node.names
    }
    assert ("opscope.engine.core.results", "RUN_NAME_MAX_CHARS") in imported
    assert cli_args.RUN_NAME_MAX_CHARS is results.RUN_NAME_MAX_CHARS  # --name takes the same names
    own = [
        node.lineno
        for node in tree.body
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        and isinstance(node.value, ast.Constant)
        and node.value.value == cli_args.RUN_NAME_MAX_CHARS
    ]
    assert own == []  # the limit is not written a second time
    ok = "r" * cli_args.RUN_NAME_MAX_CHARS
    assert runstore.validate_name(ok) == cli_args.run_name(ok) == ok


def test_run_name_too_long_is_one_line(capsys, tmp_path):
    name = "r" * (cli_args.RUN_NAME_MAX_CHARS + 1)
    with pytest.raises(SystemExit) as e:
        main(["bench", "matmul", "--quick", "--name", name, "--db", str(tmp_path / "runs.db")])
    assert e.value.code == 2
    assert _err_lines(capsys) == [
        f"opscope: error: argument --name: {name!r} is not a run name: use 1…200 "
        f"characters, no leading or trailing spaces"
    ]
