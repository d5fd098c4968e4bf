"""Ctrl-C (SIGINT) at any moment ends `opscope` with one line and exit 130; SIGTERM with one line
and exit 143, after the same clean-up (a benchmark's run is closed as aborted, what it measured kept).

Real processes through the installed `opscope` script, signalled at fixed delays, while the model
file is being mapped (seen in /proc/PID/maps) and while tokens stream.
"""

from __future__ import annotations

import select
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

OPSCOPE = str(Path(sys.executable).parent / "opscope")
INTERRUPTED = "opscope: interrupted\n"
TERMINATED = "opscope: terminated\n"
LONG_GENERATION = ("generate", "Once upon a time", "--max-tokens", "8000", "--ignore-eos")


def start(*args) -> subprocess.Popen:
    return subprocess.Popen(
        [OPSCOPE, *map(str, args)], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def finish(p: subprocess.Popen) -> tuple[int, str]:
    _, err = p.communicate(timeout=300)
    return p.returncode, err.decode("utf-8", "replace")


def wait_until(condition, what: str, timeout_s: float = 300.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def first_output(p: subprocess.Popen, timeout_s: float = 300.0) -> bytes:
    """Blocks until the process writes to stdout (the first generated token)."""
    ready, _, _ = select.select([p.stdout], [], [], timeout_s)
    assert ready, "no token within the timeout"
    return p.stdout.read1(1)


def maps_file(p: subprocess.Popen, path: str) -> bool:
    try:
        return path in Path(f"/proc/{p.pid}/maps").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False


@pytest.mark.parametrize("delay_s", [0.2, 1.0])
def test_sigint_after_a_delay_is_one_line_and_130(delay_s):
    p = start(*LONG_GENERATION)
    time.sleep(delay_s)  # still importing, parsing or loading: no model output yet
    p.send_signal(signal.SIGINT)
    assert finish(p) == (130, INTERRUPTED)


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc to see the model being mapped")
def test_sigint_while_the_model_loads(default_model_path):
    p = start(*LONG_GENERATION)
    wait_until(lambda: maps_file(p, str(default_model_path)) or p.poll() is not None, "the model to be mapped")
    p.send_signal(signal.SIGINT)
    rc, err = finish(p)
    assert (rc, err) == (130, INTERRUPTED)


def test_sigint_while_generating():
    p = start(*LONG_GENERATION)
    assert first_output(p)
    p.send_signal(signal.SIGINT)
    assert finish(p) == (130, INTERRUPTED)


def test_sigterm_while_generating():
    p = start(*LONG_GENERATION)
    assert first_output(p)
    p.send_signal(signal.SIGTERM)
    assert finish(p) == (143, TERMINATED)


def test_sigint_ignored_by_the_parent_stays_ignored():
    """A background job of a shell script inherits SIGINT ignored; opscope must not undo that."""
    p = subprocess.Popen(
        [OPSCOPE, "runs", "list", "--db", "/nonexistent/x.sqlite"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    time.sleep(0.3)
    p.send_signal(signal.SIGINT)
    rc, err = finish(p)
    assert rc == 0 and err == ""


def _metric_count(db: Path) -> int:
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            return conn.execute("SELECT count(*) FROM metrics").fetchone()[0]
    except sqlite3.Error:  # not migrated yet
        return 0


def test_sigterm_during_a_benchmark_keeps_the_run_and_its_points(tmp_path):
    db = tmp_path / "store" / "runs.sqlite"
    p = start(
        "bench",
        "matmul",
        "--quick",
        "--param",
        "sizes=64,96,128,160,192",
        "--param",
        "dtypes=float32",
        "--min-time",
        "1",
        "--db",
        db,
    )
    wait_until(lambda: _metric_count(db) >= 1 or p.poll() is not None, "the first point to be saved")
    p.send_signal(signal.SIGTERM)
    rc, err = finish(p)
    assert rc == 143
    lines = [line for line in err.splitlines() if line.strip()]  # the progress bar ends its line
    assert lines == [
        f"opscope: created run store {db}",
        "opscope: terminated (benchmark cancelled; the points measured so far are saved)",
    ]
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert conn.execute("SELECT status FROM runs").fetchall() == [("aborted",)]
        assert conn.execute("SELECT count(*) FROM metrics").fetchone()[0] >= 1
