"""Opening a run database: URL resolution, SQLite tuning, and schema migration on open.

Any SQLAlchemy URL works. Without one: ``$OPSCOPE_DB`` if set, else ``runs.sqlite`` in
``platformdirs.user_data_dir("opscope")``. A bare file path is taken as a SQLite file.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError

from opscope.engine.errors import StoreError

log = logging.getLogger(__name__)

DB_ENV_VAR = "OPSCOPE_DB"
DB_FILE_NAME = "runs.sqlite"
MIGRATIONS_DIR = Path(__file__).with_name("migrations")
VERSION_TABLE = "opscope_alembic_version"  # own name: the store may share a PostgreSQL database
SQLITE_BUSY_TIMEOUT_S = 15.0  # a GUI reading while a benchmark commits waits instead of failing
_PG_MIGRATION_LOCK_KEY = 0x0505C0BE  # advisory lock so two processes never migrate at once


def default_db_url() -> str:
    from platformdirs import user_data_dir

    env = os.environ.get(DB_ENV_VAR)
    if env:
        return resolve_url(env)
    data_dir = Path(user_data_dir("opscope", appauthor=False))
    return f"sqlite:///{data_dir / DB_FILE_NAME}"


def resolve_url(url: str | os.PathLike | None) -> str:
    """A SQLAlchemy URL for ``url``: None means the default, a path means a SQLite file."""
    if url is None:
        return default_db_url()
    url = os.fspath(url)
    if "://" not in url:
        return f"sqlite:///{Path(url).expanduser().resolve()}"
    return url


def display_url(url: str) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


class StoreMissingError(StoreError):
    """A command that only reads found no SQLite store at its path; it creates none."""

    def __init__(self, path: Path):
        self.path = path
        super().__init__(f"no run store at {path} yet (nothing saved there): `opscope bench SUITE` creates it, "
                         f"or pass --db")


def location(url: str) -> str:
    """Where a store is, for people: a SQLite file's path, else the URL without its password."""
    try:
        path = _sqlite_file(url)
    except ArgumentError:
        path = None
    return str(path) if path is not None else display_url(url)


def missing_sqlite_file(url: str) -> Path | None:
    """The SQLite file ``url`` names when it does not exist yet (None: it exists, or not SQLite)."""
    try:
        path = _sqlite_file(url)
    except ArgumentError:
        return None
    return path if path is not None and not path.exists() else None


# SQLite's own words for the failures people meet → what to do about them.
_SQLITE_HINTS = (
    ("readonly database", "the file is read-only: make it writable or pass another --db"),
    ("unable to open database file", "cannot open or create the file: its folder must exist and be writable; "
                                     "or pass another --db"),
    ("file is not a database", "the file is not a SQLite database, or is corrupt: move it away (a new store "
                               "is then created) or pass another --db"),
    ("malformed", "the database is corrupt: move it away (a new store is then created) or pass another --db"),
    ("disk is full", "the disk is full (or a file-size limit was reached): free some space and retry"),
    ("disk i/o error", "the disk failed to read or write it (full, or a file-size limit?): free some space "
                       "and retry"),
    ("database is locked", "another process holds it locked: retry when it is done"),
)


def db_error_reason(e: BaseException) -> str:
    """The database's message in one line, without the SQL statement and its parameters (they stay
    on the exception, shown by --debug), and what to do when it is a failure people meet."""
    if isinstance(e, OSError):
        message = f"{e.strerror or e}" + (f": {e.filename}" if e.filename else "")
    else:
        message = str(getattr(e, "orig", None) or e).split("\n")[0]
        message = message.split(" [SQL:")[0].split(" (Background on this error")[0].strip()
    for needle, hint in _SQLITE_HINTS:
        if needle in message.lower():
            return f"{hint} ({message})"
    return message


def store_error(url: str, what: str, e: BaseException) -> StoreError:
    """One line for a failed store operation: where, what, why, what to do."""
    log.debug("run store %s: cannot %s", display_url(url), what, exc_info=e)
    return StoreError(f"run store {location(url)}: cannot {what}: {db_error_reason(e)}")


def _sqlite_file(url: str) -> Path | None:
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def _tune_sqlite(engine: Engine, is_file: bool) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record) -> None:
        # SQLAlchemy's documented recipe: the sqlite3 module (legacy mode) would not BEGIN before DDL
        # or SELECT, so migrations would not be atomic; we emit BEGIN ourselves (see _on_begin).
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA foreign_keys=ON")  # per connection; needed for ON DELETE CASCADE
        if is_file:
            # WAL: readers (the GUI) never block the writer (a benchmark); NORMAL sync in WAL keeps
            # every commit across a process crash (kill -9), only a power cut may lose the last ones.
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        immediate = conn.get_execution_options().get("sqlite_immediate", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def create_db_engine(url: str, create: bool = True) -> Engine:
    """An Engine for ``url`` (already resolved), with SQLite tuned; the database is not touched.
    ``create=False`` (commands that only read): a missing SQLite file raises StoreMissingError and
    nothing is created; else its folder is made as needed."""
    try:
        sqlite_path = _sqlite_file(url)
        is_sqlite = make_url(url).get_backend_name() == "sqlite"
    except ArgumentError as e:
        raise StoreError(f"cannot open run database {display_url(url)}: {e}; "
                         f"pass a SQLAlchemy URL or a file path with --db") from e
    if sqlite_path is not None and not sqlite_path.exists():
        if not create:
            raise StoreMissingError(sqlite_path)
        try:
            sqlite_path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise store_error(url, f"create its folder {sqlite_path.parent}", e) from e
    try:
        connect_args = {"timeout": SQLITE_BUSY_TIMEOUT_S} if is_sqlite else {}
        engine = create_engine(url, connect_args=connect_args)
    except (ArgumentError, SQLAlchemyError, ImportError) as e:
        raise StoreError(f"cannot open run database {display_url(url)}: {e}; "
                         f"pass a SQLAlchemy URL or a file path with --db") from e
    if is_sqlite:
        _tune_sqlite(engine, is_file=sqlite_path is not None)
    return engine


def _alembic_config(conn: Connection):
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["connection"] = conn
    cfg.attributes["version_table"] = VERSION_TABLE
    return cfg


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    return ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()


def current_revision(conn: Connection) -> str | None:
    from alembic.runtime.migration import MigrationContext

    return MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_revision()


def _lock_for_migration(conn: Connection) -> None:
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_MIGRATION_LOCK_KEY})


def migrate(engine: Engine, revision: str = "head") -> None:
    """Bring the schema to ``revision`` in one transaction, under a lock, if it is not there yet."""
    from alembic import command
    from alembic.util import CommandError

    try:
        with engine.connect().execution_options(sqlite_immediate=True) as conn, conn.begin():
            _lock_for_migration(conn)
            target = head_revision() if revision == "head" else revision
            if current_revision(conn) == target:
                return
            log.info("migrating run database %s to %s", display_url(str(engine.url)), target)
            command.upgrade(_alembic_config(conn), revision)
    except CommandError as e:
        raise StoreError(f"run database {display_url(str(engine.url))} has a schema this OpScope does "
                         f"not know ({e}); upgrade OpScope or use another --db") from e
    except SQLAlchemyError as e:
        raise store_error(str(engine.url), "open it", e) from e
