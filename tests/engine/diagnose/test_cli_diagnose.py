"""`opscope diagnose` refuses bad input in one line with exit code 2, before anything is loaded."""

from __future__ import annotations

import pytest
from opscope.engine.cli.main import main


@pytest.mark.parametrize(
    "argv, line",
    [
        (
            ["diagnose", "--tokens", "1"],
            "opscope: error: --tokens and --trace-tokens must be at least 2 (a prefill, then decode steps)",
        ),
        (
            ["diagnose", "--trace-tokens", "1"],
            "opscope: error: --tokens and --trace-tokens must be at least 2 (a prefill, then decode steps)",
        ),
        (["diagnose", "why"], "opscope: error: unexpected 'why': give `-- python SCRIPT [ARGS]` or `diff A B`"),
        (
            ["diagnose", "diff", "a"],
            "opscope: error: `opscope diagnose diff` takes two saved diagnoses (id or name), got 1",
        ),
        (
            ["diagnose", "--", "python", "no_such_script.py"],
            "opscope: error: script no_such_script.py not found (looked in {cwd})",
        ),
        (
            ["diagnose", "--cwd", "/no/such/dir", "--", "python", "x.py"],
            "opscope: error: --cwd /no/such/dir: no such folder",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(argv, line, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == line.format(cwd=tmp_path)


def test_help_names_the_script_form_and_diff(capsys):
    with pytest.raises(SystemExit) as e:
        main(["diagnose", "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    assert "usage: opscope diagnose [-h]" in out and "-- python SCRIPT [ARGS] | diff A B" in out
    assert "--markdown FILE" in out and "--prompt-tokens PROMPT_TOKENS" in out
