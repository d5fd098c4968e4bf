"""The run store's failures are one line (where, what, why, what to do) without the SQL statement or
its parameters (--debug shows them); commands that only read never create a store.

Real processes through the installed `opscope` script, on real files: a read-only store, an
unwritable folder, a corrupt file, and a write past RLIMIT_FSIZE (EFBIG: the unprivileged stand-in
for a full disk, which would need a small tmpfs). Permissions do not bind root: as root, the child
runs without the capabilities that
override file modes (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH), dropped from its bounding set.
"""

from __future__ import annotations

import ctypes
import os
import resource
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

OPSCOPE = str(Path(sys.executable).parent / "opscope")
PR_CAPBSET_DROP, CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 24, 1, 2
QUICK_BENCH = ("bench", "matmul", "--quick", "--param", "sizes=64", "--param", "dtypes=float32")


def _unprivileged() -> None:
    """In the child before exec: as root, lose the power to ignore file modes (as any user has)."""
    if os.geteuid() == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        for cap in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
            if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def opscope(*args, preexec=None) -> subprocess.CompletedProcess:
    return subprocess.run([OPSCOPE, *map(str, args)], capture_output=True, text=True, timeout=300, preexec_fn=preexec)


def one_line(r: subprocess.CompletedProcess) -> str:
    assert r.stderr.endswith("\n") and r.stderr.count("\n") == 1, r.stderr
    return r.stderr.rstrip("\n")


def _store_with_one_run(path: Path) -> None:
    from opscope.engine.core.results import RunResult
    from opscope.engine.store import RunStore

    with RunStore.open(path) as store:
        store.save(RunResult(kind="matmul", name="first"))


# --- a missing store ------------------------------------------------------------------------


def test_runs_list_on_the_default_missing_store_says_where_and_creates_nothing():
    data = Path(os.environ["XDG_DATA_HOME"])
    r = opscope("runs", "list")
    assert r.returncode == 0 and r.stderr == ""
    where = data / "opscope" / "runs.sqlite"
    assert r.stdout == f"no saved runs: no run store at {where} yet (`opscope bench SUITE` creates it)\n"
    assert not (data / "opscope").exists()


@pytest.mark.parametrize("argv", [("runs", "show", "1"), ("runs", "tag", "first", "x"), ("runs", "compare")])
def test_other_runs_commands_on_a_missing_store_are_one_line_and_create_nothing(tmp_path, argv):
    db = tmp_path / "nowhere" / "runs.sqlite"
    r = opscope(*argv, "--db", db)
    assert r.returncode == 2
    assert one_line(r) == (
        f"opscope: error: no run store at {db} yet (nothing saved there): "
        f"`opscope bench SUITE` creates it, or pass --db"
    )
    assert not db.parent.exists()


# --- a corrupt store ------------------------------------------------------------------------


@pytest.mark.parametrize("content", [b"\x00garbage" * 600, b"SQLite format 3\x00" + b"\xff" * 8000])
def test_corrupt_store_is_one_line(tmp_path, content):
    db = tmp_path / "runs.sqlite"
    db.write_bytes(content)
    r = opscope("runs", "list", "--db", db)
    assert r.returncode == 2
    assert one_line(r) == (
        f"opscope: error: run store {db}: cannot open it: the file is not a SQLite "
        f"database, or is corrupt: move it away (a new store is then created) or pass "
        f"another --db (file is not a database)"
    )
    assert db.read_bytes() == content  # left as it was


# --- a read-only store and an unwritable folder ----------------------------------------------------


def test_read_only_store_reads_but_refuses_a_write_in_one_line_without_sql(tmp_path):
    db = tmp_path / "runs.sqlite"
    _store_with_one_run(db)
    db.chmod(0o444)
    listed = opscope("runs", "list", "--db", db, preexec=_unprivileged)
    assert listed.returncode == 0 and "first" in listed.stdout, listed.stderr
    r = opscope("runs", "tag", "first", "fast", "--db", db, preexec=_unprivileged)
    assert r.returncode == 2
    assert one_line(r) == (
        f"opscope: error: run store {db}: cannot tag run first: the file is read-only: "
        f"make it writable or pass another --db (attempt to write a readonly database)"
    )
    debug = opscope("runs", "tag", "first", "fast", "--db", db, "--debug", preexec=_unprivileged)
    assert debug.returncode != 0 and "[SQL: INSERT INTO run_tags" in debug.stderr  # the details, on demand


def test_unwritable_folder_is_one_line(tmp_path):
    folder = tmp_path / "locked"
    folder.mkdir(mode=0o555)
    db = folder / "runs.sqlite"
    r = opscope(*QUICK_BENCH, "--db", db, preexec=_unprivileged)
    assert r.returncode == 2
    assert one_line(r) == (
        f"opscope: error: run store {db}: cannot open it: cannot open or create the file: "
        f"its folder must exist and be writable; or pass another --db "
        f"(unable to open database file)"
    )
    deeper = folder / "sub" / "runs.sqlite"
    r = opscope(*QUICK_BENCH, "--db", deeper, preexec=_unprivileged)
    assert r.returncode == 2
    assert one_line(r) == (
        f"opscope: error: run store {deeper}: cannot create its folder {deeper.parent}: "
        f"Permission denied: {deeper.parent}"
    )
    assert list(folder.iterdir()) == []
    folder.chmod(0o755)  # let pytest clean up


# --- a full disk ----------------------------------------------------------------------------


def _file_size_limit(limit_bytes: int):
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return apply


def test_write_past_the_file_size_limit_is_one_line(tmp_path):
    """RLIMIT_FSIZE makes write() fail with EFBIG (Python ignores SIGXFSZ), as a full disk makes it
    fail with ENOSPC: SQLite reports it and the store says what to do."""
    db = tmp_path / "new" / "runs.sqlite"
    r = opscope(*QUICK_BENCH, "--db", db, preexec=_file_size_limit(8192))
    assert r.returncode == 2
    assert one_line(r) == (
        f"opscope: error: run store {db}: cannot open it: the disk failed to read or write "
        f"it (full, or a file-size limit?): free some space and retry (disk I/O error)"
    )


def test_the_store_cut_short_by_the_limit_stays_a_valid_database(tmp_path):
    db = tmp_path / "runs.sqlite"
    _store_with_one_run(db)
    r = opscope("runs", "tag", "first", "x" * 60_000, "--db", db, preexec=_file_size_limit(40_000))
    assert r.returncode == 2
    assert one_line(r) == (
        f"opscope: error: run store {db}: cannot tag run first: the disk failed to read or "
        f"write it (full, or a file-size limit?): free some space and retry (disk I/O error)"
    )
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert conn.execute("SELECT name FROM runs").fetchall() == [("first",)]
