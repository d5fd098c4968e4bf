"""A full disk: one line, exit 2, and nothing already saved is lost.

Real kernel errors, no mocks: /dev/full fails every write with ENOSPC (the files commands write with
``-o``, and a redirected stdout), and RLIMIT_FSIZE in the child makes write() past the limit fail with
EFBIG (Python ignores SIGXFSZ) on a real SQLite store that already holds runs: a benchmark cannot
save its run there. Afterwards the store is opened (by sqlite3, not by OpScope) and its runs
counted.
"""

from __future__ import annotations

import re
import resource
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

OPSCOPE = str(Path(sys.executable).parent / "opscope")
FULL = "No space left on device — free some disk space and retry"
NAMES = ("first", "second", "third")

pytestmark = pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")


def opscope(*args, stdout=subprocess.PIPE, preexec=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [OPSCOPE, *map(str, args)], stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=300, preexec_fn=preexec
    )


def one_line(r: subprocess.CompletedProcess) -> str:
    assert r.stderr.endswith("\n") and r.stderr.count("\n") == 1, r.stderr
    assert "Traceback" not in r.stderr and "SQL" not in r.stderr, r.stderr
    return r.stderr.rstrip("\n")


@pytest.fixture
def store(tmp_path) -> Path:
    from opscope.engine.core.results import RunResult
    from opscope.engine.store import RunStore

    db = tmp_path / "runs.sqlite"
    with RunStore.open(db) as s:
        for name in NAMES:
            s.save(RunResult(kind="matmul", name=name))
    return db


def _runs(db: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        return conn.execute("SELECT name, status FROM runs ORDER BY id").fetchall()


SAVED = [(n, "completed") for n in NAMES]


@pytest.mark.parametrize("argv", [("runs", "compare", "first", "second", "-o", "/dev/full")])
def test_output_file_on_a_full_disk(store, argv):
    r = opscope("--db", store, *argv)
    assert (r.returncode, one_line(r)) == (2, f"opscope: error: cannot write /dev/full: {FULL}")
    assert _runs(store) == SAVED


@pytest.mark.parametrize("argv", [("runs", "export", "first")])
def test_redirected_stdout_on_a_full_disk(store, argv):
    with open("/dev/full", "w") as full:
        r = opscope("--db", store, *argv, stdout=full)
    assert (r.returncode, one_line(r)) == (2, f"opscope: error: cannot write to standard output: {FULL}")
    assert _runs(store) == SAVED


def _closed_pipe() -> int:
    """The write end of a pipe whose reader is gone: a write fails with EPIPE."""
    import os

    r, w = os.pipe()
    os.close(r)
    return w


@pytest.mark.parametrize("argv", [("generate", "--help")])  # bare --help imports every command (torch): slow
def test_help_whose_stdout_cannot_be_written(argv):
    """argparse drops a failed write of its help: it exited 0 with nothing written anywhere."""
    import os

    with open("/dev/full", "w") as full:
        r = opscope(*argv, stdout=full)
    assert (r.returncode, one_line(r)) == (2, f"opscope: error: cannot write to standard output: {FULL}")
    w = _closed_pipe()
    try:  # a reader that went away (`opscope --help | true`): quiet, as SIGPIPE ends `yes | head`
        r = opscope(*argv, stdout=w)
    finally:
        os.close(w)
    assert (r.returncode, r.stderr) == (141, "")
    r = subprocess.run(
        f"exec {OPSCOPE} {' '.join(argv)} >&-", shell=True, stderr=subprocess.PIPE, text=True, timeout=120
    )  # started without a stdout
    assert (r.returncode, one_line(r)) == (
        2,
        "opscope: error: cannot write to standard output: Bad file descriptor (it is closed)",
    )


def _file_size_limit(limit_bytes: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return apply


def test_a_benchmark_that_cannot_save_its_run_is_one_line(store):
    """`opscope bench` on a store that cannot grow: it opens (its 32 KiB WAL index fits under the
    limit), the run begins, and its results no longer fit in the write-ahead log: EFBIG. The
    measurement goes on, its table is printed, then one line naming the store and what to do (no
    blank line left by the progress bar), exit 2; the runs saved before are intact, the file a
    valid database, and the new run never shows as completed."""
    r = opscope(
        "bench",
        "matmul",
        "--quick",
        "--param",
        "sizes=64",
        "--param",
        "dtypes=float32",
        "--db",
        store,
        preexec=_file_size_limit(34_000),
    )
    assert r.returncode == 2, r.stderr
    assert re.fullmatch(
        rf"opscope: error: run store {re.escape(str(store))}: cannot [^:]+: the disk failed to read "
        rf"or write it \(full, or a file-size limit\?\): free some space and retry \(disk I/O error\)",
        one_line(r),
    ), r.stderr
    runs = _runs(store)
    assert runs[:3] == SAVED and all(status != "completed" for _, status in runs[3:]), runs
    # nothing measured is lost: the results table is printed before the error
    assert r.stdout.startswith("matmul — completed — not saved"), r.stdout
    assert re.search(r"^│ matmul_float32_64 +│ GFLOP/s +│ +\d", r.stdout, re.M), r.stdout
