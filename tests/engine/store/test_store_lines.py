"""Every run store problem is one line naming the store, without SQL or SQLAlchemy's warnings, exit 2;
in-process through engine.cli.main on real SQLite files and (the PostgreSQL cases) the session's
real server (tests/conftest.py `pg_server`)."""

from __future__ import annotations

import sqlite3
import warnings

import pytest
from opscope.engine.cli.main import main
from opscope.engine.core.errors import StoreError
from opscope.engine.core.results import RunResult
from opscope.engine.store import RunStore, db

URL_FORMS = "a file path, sqlite:///PATH or postgresql+psycopg://USER:PASSWORD@HOST:PORT/DATABASE"


def err_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.endswith("\n") and err.count("\n") == 1, err
    return err.rstrip("\n")


@pytest.fixture
def store(tmp_path):
    path = tmp_path / "runs.sqlite"
    with RunStore.open(path) as s:
        s.save(RunResult(kind="matmul", name="first"))
    return path


def test_read_only_url_reads_without_sqlalchemys_warning_and_refuses_a_write(store, capsys):
    url = f"sqlite:///{store}?mode=ro"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # SQLAlchemy's "mode is ignored" SAWarning would fail the command
        assert main(["runs", "list", "--db", url]) == 0
    out = capsys.readouterr()
    assert out.err == "" and "first" in out.out
    assert main(["runs", "tag", "first", "x", "--db", url]) == 2
    assert err_line(capsys) == (
        f"opscope: error: run store {store}: cannot tag run first: the store was opened "
        f"read-only (mode=ro or immutable=1 in --db): drop that to write"
    )
    with sqlite3.connect(store) as con:  # mode=ro really reached SQLite: nothing was written
        assert con.execute("SELECT count(*) FROM run_tags").fetchone() == (0,)


def test_the_sql_of_a_failed_write_is_only_under_debug(store):
    with pytest.raises(StoreError) as caught:
        main(["runs", "tag", "first", "x", "--db", f"sqlite:///{store}?mode=ro", "--debug"])
    assert "[SQL: INSERT INTO run_tags" in str(caught.value.__cause__)
    assert "SQL" not in str(caught.value)


def test_sqlites_own_uri_form_names_the_same_file(store, capsys):
    assert main(["runs", "show", "first", "--db", f"sqlite:///file:{store}?mode=ro&uri=true"]) == 0
    assert "first" in capsys.readouterr().out


def test_an_unknown_sqlite_url_option_is_one_line(store, capsys):
    url = f"sqlite:///{store}?mdoe=ro"
    assert main(["runs", "list", "--db", url]) == 2
    assert err_line(capsys) == (
        f"opscope: error: cannot open run database {url}: unknown SQLite URL option "
        f"'mdoe': use cache, cached_statements, check_same_thread, detect_types, "
        f"immutable, isolation_level, mode, modeof, nolock, psow, timeout, vfs"
    )


@pytest.mark.parametrize("as_url", [False, True])
def test_a_folder_given_as_the_store_is_one_line(tmp_path, capsys, as_url):
    arg = f"sqlite:///{tmp_path}" if as_url else str(tmp_path)
    assert main(["runs", "list", "--db", arg]) == 2
    assert err_line(capsys) == (
        f"opscope: error: run store {tmp_path}: is a folder, not a SQLite file: pass a "
        f"file in it, e.g. --db {tmp_path / 'runs.sqlite'}"
    )


def test_a_locked_store_is_one_line(store, capsys, monkeypatch):
    monkeypatch.setattr(db, "SQLITE_BUSY_TIMEOUT_S", 0.05)
    holder = sqlite3.connect(store, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        assert main(["runs", "tag", "first", "x", "--db", str(store)]) == 2
    finally:
        holder.close()
    assert err_line(capsys) == (
        f"opscope: error: run store {store}: cannot open it: another process holds it "
        f"locked: retry when it is done (database is locked)"
    )


def test_a_store_from_a_newer_version_is_one_line(store, capsys):
    with sqlite3.connect(store) as con:
        con.execute(f"UPDATE {db.VERSION_TABLE} SET version_num = '9999_future'")
    assert main(["runs", "list", "--db", str(store)]) == 2
    assert err_line(capsys) == (
        f"opscope: error: run store {store}: its schema (revision 9999_future) is newer "
        f"than this OpScope knows (up to {db.head_revision()}): upgrade OpScope or use "
        f"another --db"
    )


@pytest.mark.parametrize(
    "url,line",
    [
        ("foo://bar/x", f"cannot open run database foo://bar/x: unknown database kind 'foo': use {URL_FORMS}"),
        (
            "postgresql+psycopg://u:secret@127.0.0.1:abc/db",
            "cannot open run database postgresql+psycopg://u:***@127.0.0.1:abc/db: not a database URL (invalid literal "
            f"for int() with base 10: 'abc'): use {URL_FORMS}",
        ),
        (
            "sqlite://somehost/runs.db",
            "cannot open run database sqlite://somehost/runs.db: not a database URL (a SQLite URL names no host: "
            f"sqlite:////ABSOLUTE/PATH (4 slashes) or sqlite:///RELATIVE/PATH): use {URL_FORMS}",
        ),
    ],
)
def test_an_unusable_url_is_one_line_without_its_password(capsys, url, line):
    assert main(["runs", "list", "--db", url]) == 2
    assert err_line(capsys) == f"opscope: error: {line}"


def test_a_write_command_creates_a_missing_folder_and_says_so(tmp_path, capsys):
    target = tmp_path / "new" / "deeper" / "team.sqlite"
    src = tmp_path / "src.sqlite"
    with RunStore.open(src) as s:
        s.save(RunResult(kind="matmul", name="first"))
    assert main(["runs", "push", "--to", str(target), "--db", str(src)]) == 0
    assert err_line(capsys) == f"opscope: created run store {target}"
    assert target.is_file()


# --- PostgreSQL: the session's real server ----------------------------------------------------


@pytest.mark.postgres
@pytest.mark.parametrize(
    "where,hint",
    [
        ("database", "no such database or user on the server: create it (createdb NAME) or check --db"),
        ("user", "no such database or user on the server: create it (createdb NAME) or check --db"),
        ("port", "no PostgreSQL server answers at that host and port: start it or check HOST:PORT in --db"),
    ],
)
def test_postgres_connection_problems_are_one_line_with_what_to_do(pg_server, capsys, where, hint):
    from sqlalchemy.engine import make_url

    server = make_url(pg_server)
    url = {
        "database": server.set(database="nosuchdb"),
        "user": server.set(username="nosuchuser", database="postgres"),
        "port": server.set(port=_closed_port(), database="postgres"),
    }[where].render_as_string(False)
    assert main(["runs", "list", "--db", url]) == 2
    line = err_line(capsys)
    assert line.startswith(f"opscope: error: run store {url}: cannot open it: {hint} (connection failed: "), line
    assert "[SQL" not in line and "Background" not in line


@pytest.mark.postgres
def test_postgres_wrong_password_is_one_line_without_the_password(pg_server, capsys):
    """The session's server trusts every local user: one role is given password authentication
    (a line of pg_hba.conf put back afterwards) so that a wrong password is refused for real."""
    import psycopg
    from sqlalchemy.engine import make_url

    server = make_url(pg_server)
    admin = f"postgresql://postgres@{server.host}:{server.port}/postgres"
    with psycopg.connect(admin, autocommit=True) as con:
        hba = con.execute("SHOW hba_file").fetchone()[0]
        before = con.execute("SELECT pg_read_file(%s)", (hba,)).fetchone()[0]
        con.execute("DROP ROLE IF EXISTS pwuser")
        con.execute("CREATE ROLE pwuser LOGIN PASSWORD 'right'")
        _write_server_file(con, hba, f"host all pwuser 127.0.0.1/32 scram-sha-256\n{before}")
        try:
            _wait_for_password_auth(server)
            url = server.set(username="pwuser", password="wrong", database="postgres").render_as_string(False)
            assert main(["runs", "list", "--db", url]) == 2
        finally:
            _write_server_file(con, hba, before)
    line = err_line(capsys)
    assert line.startswith(
        f"opscope: error: run store postgresql+psycopg://pwuser:***@{server.host}:{server.port}"
        f"/postgres: cannot open it: wrong user name or password: check USER:PASSWORD in --db "
        f"(connection failed: "
    ), line
    assert "wrong" not in line.replace("wrong user name", "")


def _write_server_file(con, path: str, text: str) -> None:
    """``text`` as the server's file at ``path`` (COPY writes as the server's user), one row a line;
    CSV with quote and delimiter characters no line holds, so nothing is escaped."""
    con.execute("CREATE TEMP TABLE IF NOT EXISTS hba_lines (n int, line text)")
    con.execute("TRUNCATE hba_lines")
    lines = [ln.replace("\t", " ") for ln in text.splitlines() if ln.strip()]
    with con.cursor() as cur:
        cur.executemany("INSERT INTO hba_lines VALUES (%s, %s)", list(enumerate(lines)))
    con.execute(
        f"COPY (SELECT line FROM hba_lines ORDER BY n) TO '{path}' "
        "WITH (FORMAT csv, QUOTE e'\\x01', DELIMITER e'\\x02')"
    )
    con.execute("SELECT pg_reload_conf()")


def _wait_for_password_auth(server) -> None:
    """pg_reload_conf() signals the server and returns: wait until it asks pwuser for a password."""
    import time

    import psycopg

    deadline = time.monotonic() + 10
    while True:
        try:
            psycopg.connect(f"postgresql://pwuser@{server.host}:{server.port}/postgres").close()
        except psycopg.OperationalError as e:
            if "password" in str(e):
                return
            raise
        assert time.monotonic() < deadline, "the server did not reload pg_hba.conf"
        time.sleep(0.02)


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- a benchmark whose store cannot save: the results first, then the one line ---------------

TINY = ["matmul", "--quick", "--param", "sizes=32", "--param", "dtypes=float32"]


@pytest.mark.usefixtures("one_torch_thread")
def test_an_ab_benchmark_on_a_read_only_store_prints_its_results_then_one_line(store, capsys):
    """`opscope bench --ab` goes through the plain bench's guard (engine.bench.save_guard; the plain
    bench's case is tests/cli/test_full_disk.py): the store opens (reading is allowed), saving fails,
    the measurement goes on, both sides' tables are printed as "not saved" and B against A, then
    the one line, exit 2."""
    capsys.readouterr()
    assert main(["--db", f"sqlite:///{store}?mode=ro", "bench", *TINY, "--ab", "--param sizes=32"]) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and err.startswith(f"opscope: error: run store {store}: cannot save run '"), err
    assert err.endswith("': the store was opened read-only (mode=ro or immutable=1 in --db): drop that to write\n")
    titles = [line.strip() for line in out.splitlines() if line.startswith("matmul — ")]
    assert titles == ["matmul — completed — not saved"] * 2, out
    assert "\n#0 A: matmul, completed" in out and "\n#0 B: matmul, completed" in out, out
    with sqlite3.connect(store) as con:
        assert con.execute("SELECT name FROM runs").fetchall() == [("first",)]
