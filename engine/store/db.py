"""Opening a run database: URL resolution, SQLite tuning, and schema migration on open.

Any SQLAlchemy URL works. Without one: ``$OPSCOPE_DB`` if set, else ``runs.sqlite`` in
``platformdirs.user_data_dir("opscope")``. A bare file path is taken as a SQLite file.
"""

from __future__ import annotations

import logging
import os
import re
import warnings
from pathlib import Path
from urllib.parse import quote, unquote

from opscope.engine.core.errors import StoreError
from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SAWarning, SQLAlchemyError

log = logging.getLogger(__name__)

DB_ENV_VAR = "OPSCOPE_DB"
DB_FILE_NAME = "runs.sqlite"
MIGRATIONS_DIR = Path(__file__).with_name("migrations")
VERSION_TABLE = "opscope_alembic_version"  # own name: the store may share a PostgreSQL database
SQLITE_BUSY_TIMEOUT_S = 15.0  # a GUI reading while a benchmark commits waits instead of failing
_PG_MIGRATION_LOCK_KEY = 0x0505C0BE  # advisory lock so two processes never migrate at once
PG_CONNECT_TIMEOUT_S = 10  # a host that drops packets would otherwise hang the command for minutes
# What SQLAlchemy's pysqlite dialect takes from the URL's query, and what SQLite's own URI form takes
# (https://sqlite.org/uri.html): the latter only reach SQLite with uri=true, which we add.
_PYSQLITE_KEYS = frozenset(
    ("uri", "timeout", "isolation_level", "detect_types", "check_same_thread", "cached_statements")
)
_SQLITE_URI_KEYS = frozenset(("mode", "cache", "immutable", "nolock", "psow", "vfs", "modeof"))
URL_FORMS = "a file path, sqlite:///PATH or postgresql+psycopg://USER:PASSWORD@HOST:PORT/DATABASE"


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
    except (ArgumentError, ValueError):  # not parsed (a port that is no number): hide the password anyway
        return re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1***@", url)


class StoreMissingError(StoreError):
    """A command that only reads found no SQLite store at its path; it creates none."""

    def __init__(self, path: Path):
        self.path = path
        super().__init__(
            f"no run store at {path} yet (nothing saved there): `opscope bench SUITE` creates it, or pass --db"
        )


def location(url: str) -> str:
    """Where a store is, for people: a SQLite file's path, else the URL without its password."""
    try:
        path = _sqlite_file(url)
    except (ArgumentError, ValueError):
        path = None
    return str(path) if path is not None else display_url(url)


def missing_sqlite_file(url: str) -> Path | None:
    """The SQLite file ``url`` names when it does not exist yet (None: it exists, or not SQLite)."""
    try:
        path = _sqlite_file(url)
    except (ArgumentError, ValueError):
        return None
    return path if path is not None and not path.exists() else None


# The database's own words for the failures people meet → what to do about them.
_HINTS = (
    ("readonly database", "the file is read-only: make it writable or pass another --db"),
    (
        "unable to open database file",
        "cannot open or create the file: its folder must exist and be writable; or pass another --db",
    ),
    (
        "file is not a database",
        "the file is not a SQLite database, or is corrupt: move it away (a new store "
        "is then created) or pass another --db",
    ),
    ("malformed", "the database is corrupt: move it away (a new store is then created) or pass another --db"),
    ("disk is full", "the disk is full (or a file-size limit was reached): free some space and retry"),
    ("disk i/o error", "the disk failed to read or write it (full, or a file-size limit?): free some space and retry"),
    ("database is locked", "another process holds it locked: retry when it is done"),
    ("password authentication failed", "wrong user name or password: check USER:PASSWORD in --db"),
    ("no password supplied", "the server asks for a password: give it in --db (USER:PASSWORD@HOST) or ~/.pgpass"),
    (
        r'(database|role) "[^"]*" does not exist',
        "no such database or user on the server: create it (createdb NAME) or check --db",
    ),
    ("connection refused", "no PostgreSQL server answers at that host and port: start it or check HOST:PORT in --db"),
    ("resolve host", "unknown host name: check HOST in --db"),
    ("translate host name", "unknown host name: check HOST in --db"),
    ("invalid port", "the port must be a number in 1…65535: check PORT in --db"),
    (
        "timeout expired",
        f"no answer from the server within {PG_CONNECT_TIMEOUT_S} s: check HOST:PORT in --db "
        f"and that a firewall lets it through",
    ),
)


def db_error_reason(e: BaseException) -> str:
    """The database's message in one line, without the SQL statement and its parameters (they stay
    on the exception, shown by --debug), and what to do when it is a failure people meet."""
    if isinstance(e, OSError):
        message = f"{e.strerror or e}" + (f": {e.filename}" if e.filename else "")
    else:
        message = str(getattr(e, "orig", None) or e)
        message = message.split("[SQL:")[0].split("(Background on this error")[0]
        message = " ".join(message.split())  # a server's message may span lines
    for needle, hint in _HINTS:
        if re.search(needle, message.lower()):
            return f"{hint} ({message})"
    return message


def store_error(url: str, what: str, e: BaseException) -> StoreError:
    """One line for a failed store operation: where, what, why, what to do."""
    log.debug("run store %s: cannot %s", display_url(url), what, exc_info=e)
    reason = db_error_reason(e)
    if "readonly database" in reason and _read_only_url(url):
        reason = "the store was opened read-only (mode=ro or immutable=1 in --db): drop that to write"
    return StoreError(f"run store {location(url)}: cannot {what}: {reason}")


def _read_only_url(url: str) -> bool:
    try:
        query = make_url(url).query
    except (ArgumentError, ValueError):
        return False
    return query.get("mode") == "ro" or query.get("immutable") in ("1", "true")


def _is_true(value) -> bool:
    return str(value).lower() in ("1", "true", "yes", "on")


def _sqlite_file(url: str) -> Path | None:
    """The file a SQLite URL names, also in SQLite's URI form (``sqlite:///file:PATH?mode=ro&uri=true``)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return None
    if parsed.host or parsed.username or parsed.port:
        raise ArgumentError(
            "a SQLite URL names no host: sqlite:////ABSOLUTE/PATH (4 slashes) or sqlite:///RELATIVE/PATH"
        )
    if parsed.database in (None, "", ":memory:"):
        return None
    name = parsed.database
    if _is_true(parsed.query.get("uri")) and name.startswith("file:"):
        if parsed.query.get("mode") == "memory":
            return None
        name = unquote(name.removeprefix("file:"))
        if name.startswith("//"):  # file://HOST/PATH: SQLite takes only an empty host or localhost
            name = "/" + name[2:].partition("/")[2]
        if name in ("", ":memory:"):
            return None
    return Path(name)


def sqlite_driver_url(url: str) -> str:
    """``url`` as SQLAlchemy's SQLite driver needs it: SQLite's own options (mode=ro, immutable=1, …)
    only reach SQLite in its URI form (else SQLAlchemy warns and drops them), so a plain URL that
    has some is rewritten to it. An option neither knows is refused."""
    parsed = make_url(url)
    unknown = sorted(set(parsed.query) - _PYSQLITE_KEYS - _SQLITE_URI_KEYS)
    if unknown:
        raise StoreError(
            f"cannot open run database {display_url(url)}: unknown SQLite URL option "
            f"{unknown[0]!r}: use "
            f"{', '.join(sorted(_SQLITE_URI_KEYS | _PYSQLITE_KEYS - {'uri'}))}"
        )
    if not set(parsed.query) & _SQLITE_URI_KEYS or _is_true(parsed.query.get("uri")):
        return url
    path = _sqlite_file(url)
    if path is None:  # in memory: SQLite's URI options mean nothing there
        kept = {k: v for k, v in parsed.query.items() if k in _PYSQLITE_KEYS}
        return parsed.set(query=kept).render_as_string(hide_password=False)
    uri = parsed.set(database=f"file:{quote(str(path.absolute()))}", query={**parsed.query, "uri": "true"})
    return uri.render_as_string(hide_password=False)


def _to_wal(cur) -> None:
    """The file into WAL mode (it stays so: later connections find it there). Switching needs the
    file to itself, and SQLite answers "database is locked" at once then, without waiting out the
    busy timeout: two first opens of a new file at the same moment (the GUI's worker and a CLI
    benchmark) made one fail. So it is retried, within the busy timeout."""
    import sqlite3
    import time

    deadline, pause = time.monotonic() + SQLITE_BUSY_TIMEOUT_S, 0.005
    while True:
        try:
            cur.execute("PRAGMA journal_mode=WAL")  # a file system without WAL answers another mode
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() + pause > deadline:
                raise
            time.sleep(pause)
            pause = min(pause * 2, 0.2)


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
            _to_wal(cur)
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
        parsed = make_url(url)
        sqlite_path = _sqlite_file(url)
    except (ArgumentError, ValueError) as e:
        raise StoreError(
            f"cannot open run database {display_url(url)}: not a database URL ({e}): use {URL_FORMS}"
        ) from e
    is_sqlite = parsed.get_backend_name() == "sqlite"
    if sqlite_path is not None:
        _prepare_sqlite_file(url, sqlite_path, create)
    return _engine(url, parsed, is_sqlite, sqlite_path is not None)


def _prepare_sqlite_file(url: str, path: Path, create: bool) -> None:
    if path.is_dir():
        raise StoreError(
            f"run store {path}: is a folder, not a SQLite file: pass a file in it, e.g. --db {path / DB_FILE_NAME}"
        )
    if path.exists():
        return
    if not create:
        raise StoreMissingError(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise store_error(url, f"create its folder {path.parent}", e) from e


def _engine(url: str, parsed, is_sqlite: bool, is_file: bool) -> Engine:
    """create_engine with every failure as one line (an unknown scheme, a missing driver, a bad
    option); SQLAlchemy's warnings go to the debug log, not to the terminal."""
    where = display_url(url)
    connect_args: dict = {}
    if is_sqlite:
        connect_args["timeout"] = SQLITE_BUSY_TIMEOUT_S
        url = sqlite_driver_url(url)
    elif parsed.get_backend_name() == "postgresql" and "connect_timeout" not in parsed.query:
        connect_args["connect_timeout"] = PG_CONNECT_TIMEOUT_S
    try:
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always", SAWarning)
            engine = create_engine(url, connect_args=connect_args)
    except NoSuchModuleError as e:
        raise StoreError(
            f"cannot open run database {where}: unknown database kind {parsed.drivername!r}: use {URL_FORMS}"
        ) from e
    except ImportError as e:
        raise StoreError(
            f"cannot open run database {where}: the driver for {parsed.drivername} is not "
            f"installed ({e}): install it, "
            f"or use {URL_FORMS}"
        ) from e
    except (ArgumentError, SQLAlchemyError, TypeError, ValueError) as e:
        raise StoreError(
            f"cannot open run database {where}: not a usable URL ({' '.join(str(e).split())}): use {URL_FORMS}"
        ) from e
    for w in said:
        log.debug("run store %s: %s", where, w.message)
    if is_sqlite:
        _tune_sqlite(engine, is_file=is_file)
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
        raise _unknown_schema(engine, e) from e
    except SQLAlchemyError as e:
        raise store_error(str(engine.url), "open it", e) from e


def _unknown_schema(engine: Engine, e: Exception) -> StoreError:
    """A revision this version does not have: the store was written by a newer OpScope."""
    found = re.search(r"revision identified by '([^']+)'", str(e))
    newer = f"its schema (revision {found.group(1)}) is newer than" if found else "its schema is not one"
    log.debug("run store %s: migration failed", display_url(str(engine.url)), exc_info=e)
    return StoreError(
        f"run store {location(str(engine.url))}: {newer} this OpScope knows "
        f"(up to {head_revision()}): upgrade OpScope or use another --db"
    )
