"""Shared fixtures. The real default model is loaded once per session and shared by every test
that needs it; the Hugging Face reference is loaded once too, only by the reference tests."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

# A suite started in the background by a non-interactive shell (`make test &`, some CI runners)
# inherits SIGINT ignored, and so would every `opscope` the tests start: the Ctrl-C tests need the
# signal delivered, as a user's terminal does.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# torch.compile's first compile in a process probes every vector ISA the CPU lists by compiling and
# dlopen-ing a test program for each (11 of a trivial function's 14 s on a 2-core host, again in
# every worker and subprocess): the suite takes the ISAs /proc/cpuinfo lists as usable, as they are
# with the compiler `make setup` checks. What the tests compare (compiled against eager) is the same.
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")
# torch's OpenMP threads spin after each parallel op (libgomp's default), which on a 2-core host
# running three workers and their subprocesses takes the cores the other workers wait for: a
# torch-heavy file used 35-45 % less CPU with them sleeping (docs/decisions/0009-ci-time.md). Set
# here, before any torch import, so every worker and every process the tests start inherits it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# The fast-path kernels are built once per machine (a few minutes, `make setup` does it): keep
# their cache out of the per-test temporary dirs below.
os.environ.setdefault(
    "OPSCOPE_KERNEL_CACHE",
    os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "opscope", "kernels"),
)


@pytest.fixture(scope="session")
def default_model_path():
    from opscope.engine.core.defaults import default_model_path as find

    return find()


@pytest.fixture(scope="session")
def lm():
    """The embedded default model on CPU in float32 (shared: do not mutate it)."""
    from opscope.engine.api import load

    return load()


@pytest.fixture(scope="session")
def lm_plain():
    """The embedded default model in float32 on plain torch, no fast-path kernels (shared: do not
    mutate it)."""
    from opscope.engine.api import load

    return load(fastpath="off")


@pytest.fixture(scope="session")
def memoized_gguf_name_map():
    """transformers' GGUF loader builds gguf-py's tensor-name map once per module of the model (a
    third of loading the default model) though the map depends only on the architecture and the
    layer count: a pure function, memoized for the rest of the session once a test asks for this.
    What the loader reads and computes is unchanged."""
    import functools

    import gguf

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf, "get_tensor_name_map", functools.lru_cache(maxsize=None)(gguf.get_tensor_name_map))
        yield


@pytest.fixture(scope="session")
def memoized_gguf_reader():
    """transformers reads a GGUF through gguf-py's GGUFReader for its config, its tokenizer and its
    weights, one new reader each time, and each parses the 49k-entry vocabulary again (seconds,
    most of it in gguf-py's per-element field walk): readers of an unchanged file (same path, inode,
    size and mtime) are shared for the rest of the session once a test asks for this. Read-only
    readers only ('r': a memmap nobody writes), and their bytes are read through a plain ndarray
    view of the memmap: numpy.memmap's Python-level slicing hooks are most of the field walk's time
    (millions of slices), the bytes are the same. What the loader reads is unchanged."""
    import functools

    import gguf
    from gguf_craft import plain_view_reader

    original = gguf.GGUFReader

    @functools.lru_cache(maxsize=2)  # the default model and one other file
    def shared(path, inode, size, mtime_ns):
        return plain_view_reader(path)

    def reader(path, mode="r"):
        if mode != "r":
            return original(path, mode)
        st = os.stat(path)
        return shared(os.path.realpath(path), st.st_ino, st.st_size, st.st_mtime_ns)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf, "GGUFReader", reader)
        yield


@pytest.fixture(scope="session")
def hf_tokenizer(default_model_path, memoized_gguf_reader):
    """transformers' tokenizer built from the default GGUF (the reference; seconds to build: shared,
    do not mutate it)."""
    transformers = pytest.importorskip("transformers")
    p = default_model_path
    return transformers.AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)


@pytest.fixture(autouse=True)
def _isolated_user_dirs(tmp_path_factory, monkeypatch):
    """Every test gets its own data/config dirs: nothing touches the real user's runs or settings."""
    base = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("XDG_DATA_HOME", str(base / "data"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(base / "config"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(base / "cache"))
    monkeypatch.delenv("OPSCOPE_DB", raising=False)
    monkeypatch.setenv("OPSCOPE_CACHE_DIR", str(base / "opscope-cache"))


@pytest.fixture
def cache_dir(_isolated_user_dirs) -> Path:
    """This test's OpScope cache (OPSCOPE_CACHE_DIR, set by _isolated_user_dirs): measured peaks,
    file hashes. Not created yet."""
    return Path(os.environ["OPSCOPE_CACHE_DIR"])


@pytest.fixture
def db(tmp_path) -> str:
    """The URL of a run store of this test's own (a SQLite file, created on first open)."""
    return f"sqlite:///{tmp_path / 'runs.db'}"


@pytest.fixture(autouse=True)
def _quiet_proc(tmp_path_factory, monkeypatch):
    """Benchmarks read other processes' CPU load from a fake, quiet /proc (engine.bench.quality), so
    repetition counts do not depend on what else runs on this machine; tests of the load detection
    set OPSCOPE_PROC=/proc themselves."""
    root = tmp_path_factory.mktemp("proc")
    (root / "self").mkdir()
    (root / "stat").write_text("cpu  100 0 50 9999 0 0 0 0 0 0\n")
    (root / "self" / "stat").write_text("42 (python) R 1 42 42 0 -1 0 0 0 0 0 10 5 0 0 20 0 1 0 100 0 0\n")
    monkeypatch.setenv("OPSCOPE_PROC", str(root))


@pytest.fixture(autouse=True)
def _torch_threads_restored():
    """A test that loads a model with --threads N (or runs a bench with it) sets torch's process-wide
    count; put it back so later tests start from the same count whatever ran before them."""
    import sys

    torch = sys.modules.get("torch")
    before = torch.get_num_threads() if torch is not None else None
    yield
    if before is not None and torch.get_num_threads() != before:
        torch.set_num_threads(before)


@pytest.fixture(scope="module")
def one_torch_thread():
    """Two OpenMP threads on a shared 2-core machine run 10-20x slower than one (spin-waiting on
    a descheduled peer); tests that check behaviour, not speed, use one. Restored afterwards."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# -- PostgreSQL: one real server for the whole run ------------------------------------------------
# Debian's postgresql package (`make test` installs it). tests/engine/store/test_store_pg.py and
# tests/app/test_app_store.py share this one server; each test gets its own fresh database (pg_url).


def _pg_bindir():
    import glob
    import shutil
    from pathlib import Path

    found = glob.glob("/usr/lib/postgresql/*/bin/initdb")
    if found:
        return Path(max(found, key=lambda p: int(Path(p).parts[-3]))).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_server_user(cmd: list) -> list[str]:
    # initdb and postgres refuse to run as root: run them as the postgres system user then.
    cmd = [str(c) for c in cmd]
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


@pytest.fixture(scope="session")
def pg_server():
    """The URL (no database) of a PostgreSQL server started once for the whole test run."""
    import shutil
    import subprocess
    import tempfile
    from pathlib import Path

    bindir = _pg_bindir()
    if bindir is None:
        pytest.skip(
            "PostgreSQL server binaries (initdb, pg_ctl) not found: install Debian's "
            "`postgresql` package (`make test` does)"
        )
    base = Path(tempfile.mkdtemp(prefix="opscope-pg-"))  # pytest's tmp is private to root
    if os.geteuid() == 0:
        shutil.chown(base, "postgres")
    data, port = base / "data", _free_port()
    run = lambda cmd: subprocess.run(_as_server_user(cmd), check=True, capture_output=True, timeout=120)  # noqa: E731
    run([bindir / "initdb", "-D", data, "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync"])
    opts = f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off"
    run([bindir / "pg_ctl", "-D", data, "-l", base / "server.log", "-o", opts, "-w", "-t", "60", "start"])
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}"
    finally:
        run([bindir / "pg_ctl", "-D", data, "-m", "immediate", "stop"])
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def pg_url(pg_server):
    """A fresh, empty database on the session's server."""
    import uuid

    import psycopg

    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(f"{pg_server.replace('+psycopg', '')}/postgres", autocommit=True) as con:
        con.execute(f'CREATE DATABASE "{name}"')
    yield f"{pg_server}/{name}"
    with psycopg.connect(f"{pg_server.replace('+psycopg', '')}/postgres", autocommit=True) as con:
        con.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


# -- the checkout stays as it was (tests/test_packaging.py) ---------------------------------------
# The GUI tests that once rewrote docs/screenshots/ are watched where they run in this session: the
# tree's state before and after each, so the packaging test need not run them a second time.

TREE_WATCHED = (
    "tests/app/test_app_panels.py::test_screenshots_of_every_panel",
    "tests/cli/test_cli_gui.py::test_screenshot_of_a_failed_start_is_written_and_exits_0",
)
_tree_records: dict[str, tuple[dict, dict]] = {}

# `make test` (`--dist loadfile`): the longest files first, and the watched tests' files on the worker that
# runs test_packaging.py, before it (tests/support/file_schedule.py)
from file_schedule import pytest_xdist_make_scheduler  # noqa: E402, F401


def checkout_tree_state() -> dict[str, str]:
    """`git status --porcelain` plus a hash of each file it names (a dirty file rewritten again
    changes no status line) and of docs/screenshots."""
    import hashlib
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    r = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"], cwd=root, capture_output=True, text=True, check=True
    )
    state = {}
    for line in r.stdout.splitlines():
        path = root / line[3:].split(" -> ")[-1]
        state[line] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "-"
    for shot in sorted((root / "docs" / "screenshots").glob("*")):
        state[str(shot.relative_to(root))] = hashlib.sha256(shot.read_bytes()).hexdigest()
    return state


_tree_ran: set[str] = set()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    watched = (
        item.nodeid in TREE_WATCHED
        and not os.environ.get("OPSCOPE_SCREENSHOT_DIR")
        and os.path.exists(os.path.join(os.path.dirname(__file__), "..", ".git"))  # a file in a git worktree
    )
    before = checkout_tree_state() if watched else None
    yield  # setup, call and teardown: a fixture's teardown could write into the tree too
    if watched and item.nodeid in _tree_ran:  # it ran (passed or failed), not skipped
        _tree_records[item.nodeid] = (before, checkout_tree_state())


def pytest_runtest_logreport(report):
    if report.when == "call" and report.nodeid in TREE_WATCHED and report.outcome in ("passed", "failed"):
        _tree_ran.add(report.nodeid)


@pytest.fixture(scope="session")
def checkout_tree():
    """.state(): the tree's state now; .records: {node id: (state before, after)} of the
    TREE_WATCHED tests that ran so far in this session; .watched: their node ids."""
    from types import SimpleNamespace

    return SimpleNamespace(state=checkout_tree_state, records=_tree_records, watched=TREE_WATCHED)


# -- the default model cut to its first layers ----------------------------------------------------


# tests/engine/fastpath/test_kernel_variants.py runs files in pytest processes of their own, one
# per CPU variant: it names its own folder, so the file is written once (2-3 s), not per variant.
FIRST_LAYERS_DIR_ENV = "OPSCOPE_TEST_FIRST_LAYERS_DIR"


def _first_layers(default_model_path, tmp_path_factory, n_layers: int) -> Path:
    """The embedded default model's first ``n_layers`` of its 30 layers, as a GGUF file
    (gguf_craft.first_layers_gguf). Written once per run: under pytest-xdist the workers share it
    (their base temp folders' parent is the run's own), the first one writing it under a lock."""
    import fcntl

    from gguf_craft import first_layers_gguf

    root = tmp_path_factory.getbasetemp()
    folder = (root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root) / "first-layers"
    folder = Path(os.environ.get(FIRST_LAYERS_DIR_ENV) or folder)  # a pytest run started by a test: its parent's
    folder.mkdir(exist_ok=True)
    path = folder / f"smollm2-{n_layers}-layers.gguf"
    with open(folder / "lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.is_file():
            first_layers_gguf(default_model_path, folder / "part.gguf", n_layers).rename(path)
    return path


@pytest.fixture(scope="session")
def default_model_2_layers(default_model_path, tmp_path_factory):
    return _first_layers(default_model_path, tmp_path_factory, 2)


@pytest.fixture(scope="session")
def default_model_8_layers(default_model_path, tmp_path_factory):
    return _first_layers(default_model_path, tmp_path_factory, 8)


@pytest.fixture(autouse=True)
def _signal_handlers_restored():
    """A test that runs the CLI in-process can leave SIGINT/SIGTERM ignored (the CLI's clean-up after
    an interrupt ignores further ones); every child process a later test starts would inherit the
    ignored signal and never stop on Ctrl-C. Each test gets the handlers it started with back."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, handler in saved.items():
        if handler is not None and signal.getsignal(s) != handler:
            signal.signal(s, handler)
