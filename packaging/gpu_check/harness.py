"""The machinery of the GPU check: an isolated environment, the `opscope` CLI run in subprocesses
with a time limit each, and one outcome per check (pass, fail or skip, with its figures).

Nothing here knows a check; checks.py holds them, run.py runs them in order.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("gpu_check")

# What the GPU image lacks that `opscope` (its engine and CLI, not the GUI) imports, by module
# name, which is also the start of its wheel's file name; the Makefile's GPU_WHEELS pins the
# versions `make gpu-wheels` downloads. Everything else it needs (torch, numpy, safetensors,
# tokenizers, jinja2, psutil, scipy, rich, nvidia-ml-py, pyyaml, tqdm, requests, markupsafe,
# typing-extensions) is in the image (docs/gpu.md).
WHEELS = ("gguf", "sqlalchemy", "alembic", "mako", "platformdirs")


class CheckFailed(Exception):
    """A check's own verdict: what was expected and what came."""


class Skipped(Exception):
    """A check that cannot run here (the dry run on a CPU), with the reason."""


@dataclass
class Outcome:
    name: str
    status: str  # "pass" | "fail" | "skip"
    reason: str = ""
    seconds: float = 0.0
    figures: dict[str, Any] = field(default_factory=dict)
    commands: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Proc:
    """One finished subprocess: its exit code and output (also kept in the check's log)."""

    argv: list[str]
    code: int
    stdout: str
    stderr: str
    seconds: float

    def json(self) -> Any:
        try:
            return json.loads(self.stdout)
        except json.JSONDecodeError as e:
            raise CheckFailed(f"`{_short(self.argv)}` printed no JSON ({e}); stdout began {self.stdout[:200]!r}") from e


class Ctx:
    """What every check gets: paths, the interpreter, the mode, the models, the figures so far."""

    def __init__(self, out: Path, repo: Path, python: str, dry: bool, budget_s: float) -> None:
        self.out, self.repo, self.python, self.dry = out, repo, python, dry
        self.scratch = out / "scratch"
        self.logs = out / "logs"
        self.models: dict[str, Path] = {}
        self.shared: dict[str, Any] = {}  # figures one check leaves for a later one (bandwidth → MBU)
        self.deadline = time.monotonic() + budget_s
        self.env = dict(os.environ)
        self.db = str(out / "runs.db")
        self.commands: list[str] = []  # the current check's, for its outcome
        self.log_name = "setup"
        self.background: dict[str, tuple] = {}

    @property
    def device(self) -> str:
        return "cpu" if self.dry else "cuda"

    def left_s(self) -> float:
        return self.deadline - time.monotonic()

    def run(
        self, argv: list[str], timeout_s: float, env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> Proc:
        """``argv`` in its own process group, killed whole at ``timeout_s`` (or when the budget ends)."""
        limit = max(1.0, min(timeout_s, self.left_s()))
        self.commands.append(_short(argv))
        t0 = time.monotonic()
        p = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env or self.env,
            cwd=str(cwd or self.repo),
            start_new_session=True,
        )
        try:
            stdout, stderr = p.communicate(timeout=limit)
        except subprocess.TimeoutExpired as e:
            _kill_group(p)
            stdout, stderr = p.communicate()
            self._log(argv, -9, stdout, stderr)
            raise CheckFailed(f"`{_short(argv)}` ran past its limit of {limit:.0f} s and was killed") from e
        proc = Proc(argv, p.returncode, stdout, stderr, time.monotonic() - t0)
        self._log(argv, p.returncode, stdout, stderr)
        return proc

    def cli(self, *args: str, timeout_s: float = 120, ok_codes: tuple[int, ...] = (0,)) -> Proc:
        """``opscope --db <the check's store> ARGS`` as a user runs it; a code outside ``ok_codes``
        fails the check with the command's last error line."""
        proc = self.run([self.python, "-m", "opscope", "--db", self.db, *args], timeout_s)
        if proc.code not in ok_codes:
            raise CheckFailed(f"`opscope {' '.join(args)}` exited {proc.code}: {last_line(proc.stderr or proc.stdout)}")
        return proc

    def python_file(self, script: Path, *args: str, timeout_s: float = 120) -> Proc:
        proc = self.run([self.python, str(script), *args], timeout_s)
        if proc.code != 0:
            raise CheckFailed(f"{script.name} {' '.join(args)} exited {proc.code}: {last_line(proc.stderr)}")
        return proc

    def spawn(self, name: str, argv: list[str]) -> None:
        """Start ``argv`` in the background (its output into logs/NAME.out/.err); ``join`` waits."""
        self.logs.mkdir(parents=True, exist_ok=True)
        out, err = open(self.logs / f"{name}.out", "w"), open(self.logs / f"{name}.err", "w")
        p = subprocess.Popen(
            argv, stdout=out, stderr=err, text=True, env=self.env, cwd=str(self.repo), start_new_session=True
        )
        self.background[name] = (p, argv, time.monotonic(), out, err)

    def join(self, name: str, timeout_s: float) -> Proc:
        if name not in self.background:
            raise CheckFailed(f"{name} was never started (the check that starts it did not run)")
        p, argv, t0, out, err = self.background.pop(name)
        self.commands.append(_short(argv))
        try:
            p.wait(timeout=max(1.0, min(timeout_s, self.left_s())))
        except subprocess.TimeoutExpired as e:
            _kill_group(p)
            p.wait()
            raise CheckFailed(f"`{_short(argv)}` (background) ran past its limit and was killed") from e
        finally:
            out.close(), err.close()
        stdout, stderr = (
            (self.logs / f"{name}.{s}").read_text(encoding="utf-8", errors="replace") for s in ("out", "err")
        )
        return Proc(argv, p.returncode, stdout, stderr, time.monotonic() - t0)

    def stop_background(self) -> None:
        for name in list(self.background):
            p = self.background[name][0]
            _kill_group(p)
            p.wait()
            self.background.pop(name)

    def _log(self, argv: list[str], code: int, stdout: str, stderr: str) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        with open(self.logs / f"{self.log_name}.log", "a", encoding="utf-8") as f:
            f.write(f"$ {_short(argv)}\n[exit {code}]\n--- stdout\n{stdout}\n--- stderr\n{stderr}\n\n")


def run_check(ctx: Ctx, name: str, fn: Callable[[Ctx], dict[str, Any]], needs_gpu: bool) -> Outcome:
    """One check: skipped in the dry run where it needs a GPU, else run and judged."""
    if needs_gpu and ctx.dry:
        return Outcome(name, "skip", "dry run: needs a CUDA GPU (this run is on the CPU)")
    if ctx.left_s() < 5:
        return Outcome(name, "fail", "not run: the check's time budget was spent before it")
    ctx.commands, ctx.log_name = [], name
    t0 = time.monotonic()
    try:
        figures = fn(ctx) or {}
        outcome = Outcome(name, "pass", "", figures=figures)
    except Skipped as e:
        outcome = Outcome(name, "skip", str(e))
    except CheckFailed as e:
        outcome = Outcome(name, "fail", str(e), figures=getattr(e, "figures", {}))
    except Exception as e:  # a bug in the check itself must not stop the others
        log.exception("check %s crashed", name)
        outcome = Outcome(name, "fail", f"the check itself crashed: {type(e).__name__}: {e}")
    outcome.seconds, outcome.commands = round(time.monotonic() - t0, 2), list(ctx.commands)
    log.info("%-28s %-4s %6.1f s  %s", name, outcome.status, outcome.seconds, outcome.reason)
    return outcome


def fail(message: str, **figures: Any) -> CheckFailed:
    """A CheckFailed that keeps the figures measured before the verdict."""
    e = CheckFailed(message)
    e.figures = figures  # type: ignore[attr-defined]
    return e


# -- the environment ---------------------------------------------------------------------------------


def prepare_env(ctx: Ctx, wheel_dir: Path) -> dict[str, Any]:
    """A scratch site with `opscope` (this checkout, linked) and the wheels the image lacks, and a
    private home for settings, measured peaks and the run store (the user's stay untouched)."""
    site, wheels = ctx.scratch / "site", ctx.scratch / "wheels"
    site.mkdir(parents=True, exist_ok=True)
    link = site / "opscope"
    if not link.exists():
        link.symlink_to(ctx.repo.resolve(), target_is_directory=True)
    missing = [m for m in WHEELS if importlib.util.find_spec(m) is None]
    installed = _install_wheels(ctx, missing, wheel_dir, wheels) if missing else []
    if not _has_entry_points():
        _write_dist_info(ctx.repo, site)
    home = ctx.scratch / "home"
    paths = [str(site), str(wheels)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    ctx.env.update(
        PYTHONPATH=os.pathsep.join(paths),
        PYTHONUNBUFFERED="1",
        NO_COLOR="1",
        XDG_DATA_HOME=str(home / "data"),
        XDG_CONFIG_HOME=str(home / "config"),
        TORCHINDUCTOR_CACHE_DIR=str(home / "inductor"),
        COLUMNS="160",
    )
    return {
        "python": sys.version.split()[0],
        "executable": ctx.python,
        "wheels_installed": installed,
        "missing_before": missing,
    }


def _install_wheels(ctx: Ctx, missing: list[str], wheel_dir: Path, target: Path) -> list[str]:
    files = sorted(str(p) for p in wheel_dir.glob("*.whl")) if wheel_dir.is_dir() else []
    names = {Path(f).name.split("-")[0].lower() for f in files}
    lacking = [m for m in missing if m not in names]
    if lacking:
        raise CheckFailed(
            f"{', '.join(lacking)} not importable and no wheel for it in {wheel_dir}: "
            f"run `make gpu-wheels` where pip can reach PyPI, then carry .whl"
        )
    argv = [
        ctx.python,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-index",
        "--no-deps",
        "--no-compile",
        "--no-cache-dir",
        "--upgrade",
        "--target",
        str(target),
        *files,
    ]
    proc = ctx.run(argv, 120)
    if proc.code != 0:
        raise CheckFailed(f"pip could not install the carried wheels: {last_line(proc.stderr)}")
    return [Path(f).name for f in files]


def _has_entry_points() -> bool:
    import importlib.metadata

    return any(ep.name == "torch" for ep in importlib.metadata.entry_points(group="opscope.backends"))


def _write_dist_info(repo: Path, site: Path) -> None:
    """The metadata an install would leave, so the backend registry finds the built-in plugins
    (it reads entry points only) without building or installing this checkout."""
    import tomllib

    project = tomllib.loads((repo / "pyproject.toml").read_text())["project"]
    info = site / f"opscope-{project['version']}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: opscope\nVersion: {project['version']}\n")
    lines = []
    for group, eps in project.get("entry-points", {}).items():
        lines += [f"[{group}]"] + [f"{k} = {v}" for k, v in eps.items()] + [""]
    lines += ["[console_scripts]"] + [f"{k} = {v}" for k, v in project.get("scripts", {}).items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    (info / "top_level.txt").write_text("opscope\n")


# -- small helpers ---------------------------------------------------------------------------------


def last_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "(no output)"


def _short(argv: list[str]) -> str:
    return " ".join(("python" if a == sys.executable else a) for a in argv)


def _kill_group(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def which(name: str) -> str | None:
    return shutil.which(name)


def median(values: list[float]) -> float:
    s = sorted(v for v in values if v == v)
    if not s:
        return float("nan")
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2
