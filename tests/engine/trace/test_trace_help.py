"""`opscope trace --help` reads as plain terminal text; `opscope trace diff --help` is diff's own."""

from __future__ import annotations

import pytest
from opscope.engine.cli.main import main


def _help(capsys, *argv: str) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(list(argv))
    assert exit_.value.code in (0, None)
    return capsys.readouterr().out


def test_trace_help_has_no_rest_markup(capsys):
    out = _help(capsys, "trace", "--help")
    assert "usage: opscope trace" in out and "--device meta" in out
    assert "``" not in out, out  # before: ``--device meta`` verbatim


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_trace_diff_help_is_diffs_own(capsys, flag):
    out = _help(capsys, "trace", "diff", flag)
    assert out.startswith("usage: opscope trace diff"), out  # before: the whole trace command's help
    assert "--tokens" not in out and "A" in out.split("\n", 1)[0]
