"""A saved script trace records when it really ran, so `opscope runs list` shows its duration."""

from __future__ import annotations

import json
import textwrap
from datetime import datetime


def test_script_trace_run_keeps_its_real_start_and_end(tmp_path, capsys, monkeypatch):
    from opscope.engine.cli.main import main

    script = tmp_path / "slow.py"
    script.write_text(
        textwrap.dedent("""
        import time
        from opscope import step

        for _ in range(2):
            time.sleep(0.3)
            step()
        """)
    )
    monkeypatch.chdir(tmp_path)
    db = str(tmp_path / "runs.sqlite")
    assert main(["--db", db, "trace", "--target", "cpu", "--", "python", script.name]) == 0
    capsys.readouterr()
    assert main(["--db", db, "runs", "list", "--format", "json"]) == 0
    (run,) = json.loads(capsys.readouterr().out)
    took_s = (datetime.fromisoformat(run["finished_at"]) - datetime.fromisoformat(run["created_at"])).total_seconds()
    assert took_s >= 0.6, run  # before: created and finished both stamped at save time, 0.0 s
