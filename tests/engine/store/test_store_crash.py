"""Crash survival: a real process writes points, gets SIGKILL mid-run; every point it reported as
committed is in the database, the file is intact, and the next open marks the run aborted."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import textwrap

import pytest
from opscope.engine.store import RunStore

# Writes metric after metric until killed, printing each index once its commit has returned.
WRITER = textwrap.dedent("""
    import sys
    from opscope.engine.core.results import Metric, RunResult
    from opscope.engine.store import RunStore

    store = RunStore.open(sys.argv[1])
    run_id = store.begin_run(RunResult(kind="crash", name="doomed", settings={"pid": "child"}))
    i = 0
    while True:
        store.add_metric(run_id, Metric(f"m{i}", "ms", [float(i), i + 0.5, i + 0.25]))
        print(i, flush=True)
        i += 1
""")
ACKED_BEFORE_KILL = 5


@pytest.mark.slow
def test_sigkill_mid_run_keeps_committed_points_and_marks_run_aborted(tmp_path):
    if not hasattr(signal, "SIGKILL"):
        pytest.skip("no SIGKILL on this platform")
    path = tmp_path / "runs.sqlite"
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        acked = [int(child.stdout.readline()) for _ in range(ACKED_BEFORE_KILL)]
        child.send_signal(signal.SIGKILL)  # while it is still writing: no cleanup code runs
    finally:
        child.kill()
        child.wait(timeout=60)
        child.stdout.close()
    assert acked == list(range(ACKED_BEFORE_KILL)) and child.returncode == -signal.SIGKILL

    with RunStore.open(path) as store:
        info, result = store.info("doomed"), store.get("doomed")
    assert info.status == "aborted" and "ended without finishing" in info.error
    names = [m.name for m in result.metrics]
    assert len(names) >= ACKED_BEFORE_KILL  # it may have committed more after the last ack we read
    assert names == [f"m{i}" for i in range(len(names))]  # no hole, no half-written point
    assert result.metrics[3].samples == [3.0, 3.5, 3.25]
    with sqlite3.connect(path) as con:
        assert con.execute("PRAGMA integrity_check").fetchone() == ("ok",)
