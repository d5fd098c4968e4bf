"""Trace a user's own script: `opscope trace -- python SCRIPT [ARGS]` / `-- python -m MODULE [ARGS]`.

The script runs in this interpreter (runpy), as it would alone: ``sys.argv`` is the script and its
arguments, it runs as ``__main__``, ``sys.path[0]`` is its folder (the working directory for -m),
and the working directory is the one given (default: the current one). Its output is not touched.
Its exit code is kept: ``sys.exit(n)`` gives n, an exception gives 1 with its traceback on stderr
and the trace up to that point.

Steps: each ``opscope.step()`` the script calls; if it never calls one, each ``optimizer.step()``
after the first (a global post-hook, ``torch.optim.optimizer.register_optimizer_step_post_hook``;
see _Steps); if neither, the whole run is one step.
"""

from __future__ import annotations

import builtins
import io
import logging
import os
import runpy
import sys
import traceback
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from opscope.engine.core import markers
from opscope.engine.core.clock import now_ns
from opscope.engine.core.errors import ConfigError

if TYPE_CHECKING:
    from opscope.engine.trace.capture import TraceResult

log = logging.getLogger(__name__)

STEP_MARKERS, STEP_OPTIMIZER, STEP_WHOLE_RUN = "opscope.step()", "optimizer.step()", "whole run"


@dataclass(frozen=True)
class ScriptSpec:
    """What to run: a file (``path``) or a module (``module``), with its arguments and folder."""

    path: str | None = None
    module: str | None = None
    args: tuple[str, ...] = ()
    cwd: str | None = None

    @property
    def label(self) -> str:
        return f"-m {self.module}" if self.module else str(self.path)

    def command(self) -> list[str]:
        return ["python", *(["-m", self.module] if self.module else [str(self.path)]), *self.args]


def _is_python(word: str) -> bool:
    name = os.path.basename(word)
    return name.startswith("python") or os.path.abspath(word) == os.path.abspath(sys.executable)


def parse_command(words: list[str], cwd: str | None = None) -> ScriptSpec:
    """``["python", "train.py", "--lr", "1e-3"]`` or ``["python", "-m", "pkg.train", ...]``."""
    if not words or not _is_python(words[0]):
        raise ConfigError(
            f"expected `python SCRIPT [ARGS]` or `python -m MODULE [ARGS]` after --, got "
            f"{' '.join(words) or 'nothing'!r}"
        )
    rest = list(words[1:])
    if rest[:1] == ["-m"]:
        if len(rest) < 2:
            raise ConfigError("`python -m` needs a module name")
        return ScriptSpec(module=rest[1], args=tuple(rest[2:]), cwd=cwd)
    if not rest or rest[0].startswith("-"):
        raise ConfigError(
            f"expected a script file after python, got {' '.join(rest) or 'nothing'!r} "
            f"(interpreter options are not supported; run `python -X ... -m opscope.engine.cli.main` instead)"
        )
    base = Path(cwd or os.getcwd())
    if not (base / rest[0]).is_file():
        raise ConfigError(f"script {rest[0]} not found (looked in {base})")
    return ScriptSpec(path=rest[0], args=tuple(rest[1:]), cwd=cwd)


@dataclass
class ScriptOutcome:
    exit_code: int = 0
    error: str | None = None  # the traceback, when the script raised
    wall_ns: int = 0


class _SysState:
    """sys.argv, sys.path[0] and the working directory as the script expects; restored after."""

    def __init__(self, spec: ScriptSpec):
        self.spec = spec

    def __enter__(self):
        self.argv, self.path, self.cwd = sys.argv, list(sys.path), os.getcwd()
        if self.spec.cwd:
            os.chdir(self.spec.cwd)
        here = os.getcwd()
        if self.spec.module or self.spec.path is None:  # a spec names a module or a path
            sys.argv = ["-m", *self.spec.args]  # runpy.run_module(alter_sys=True) puts the file first
            first = here
        else:
            script = os.path.abspath(self.spec.path)
            sys.argv = [self.spec.path, *self.spec.args]
            first = os.path.dirname(script)
        if sys.path:
            sys.path[0] = first  # as python sets it: the script's folder replaces the runner's
        else:
            sys.path.insert(0, first)
        return self

    def __exit__(self, *exc):
        sys.argv, sys.path[:] = self.argv, self.path
        os.chdir(self.cwd)


def run_script(spec: ScriptSpec) -> ScriptOutcome:
    """Run the script as ``__main__`` here; never raises for what the script does."""
    outcome, t0 = ScriptOutcome(), now_ns()
    with _SysState(spec):
        try:
            if spec.module:
                runpy.run_module(spec.module, run_name="__main__", alter_sys=True)
            else:
                assert spec.path is not None  # a spec names a module or a path
                _run_file(os.path.abspath(spec.path))
        except SystemExit as e:
            outcome.exit_code = _exit_code(e.code)
        except KeyboardInterrupt:
            raise
        except BaseException as e:
            outcome.exit_code = 1
            outcome.error = _traceback_text(e)
            sys.stderr.write(outcome.error)
    sys.stdout.flush()
    outcome.wall_ns = now_ns() - t0
    return outcome


def _run_file(path: str) -> None:
    """Run a script file as python does: a fresh ``__main__`` (absolute ``__file__``, no spec), with
    sys.argv[0] left as typed (runpy.run_path would set it to the path it was given)."""
    with io.open_code(path) as f:
        code = compile(f.read(), path, "exec")  # bytes: the file's coding cookie is honoured
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=path, __builtins__=builtins, __spec__=None, __loader__=None, __cached__=None)
    previous = sys.modules.get("__main__")
    sys.modules["__main__"] = main  # pickle and `import __main__` find the script's own globals
    try:
        exec(code, main.__dict__)
    finally:
        if previous is not None:
            sys.modules["__main__"] = previous


def _exit_code(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message") prints it and exits 1, as python does
    return 1


def _traceback_text(e: BaseException) -> str:
    """The traceback as python prints it, without the frames of runpy and this runner."""
    tb = e.__traceback__
    skip = {os.path.abspath(runpy.__file__), os.path.abspath(__file__)}
    while tb is not None and (
        os.path.abspath(tb.tb_frame.f_code.co_filename) in skip or tb.tb_frame.f_code.co_filename == "<frozen runpy>"
    ):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(e), e, tb))


@dataclass
class ScriptTrace:
    spec: ScriptSpec
    result: TraceResult
    outcome: ScriptOutcome
    step_source: str
    health: list = field(default_factory=list)  # engine.trace.findings.Finding
    losses: list[float] = field(default_factory=list)
    roots: list[str] = field(default_factory=list)  # the script's top-level modules, by class

    @property
    def step_ms(self) -> list[float]:
        """Duration of each step after the first (the first includes setup)."""
        t = self.result.token_ns
        return [(b - a) / 1e6 for a, b in zip(t, t[1:])]


STEP_PHASE = "step"  # engine.markers phase of each step: the trace's and the telemetry's time axis


class _Steps:
    """Routes opscope.step() and optimizer.step() to the tracer. A script that marks its steps calls
    opscope.step() before its second optimizer.step(), so the first optimizer step waits to see:
    counting it at once would cut step 0 in two if a marker follows. In optimizer mode, step 0 thus
    runs to the second optimizer.step() (setup and the first iteration: excluded from per-step
    figures anyway). Each step is also a phase (engine.markers), for telemetry and the Perfetto trace."""

    def __init__(self, tracer):
        self.tracer, self.source, self.optimizer_calls = tracer, STEP_WHOLE_RUN, 0

    def begin(self) -> None:
        markers.emit(STEP_PHASE, "start", index=0)

    def end(self) -> None:
        markers.emit(STEP_PHASE, "end", index=self.tracer.step)

    def _next(self) -> None:
        t = now_ns()
        markers.emit(STEP_PHASE, "end", t, index=self.tracer.step)
        self.tracer.mark_step(t)
        markers.emit(STEP_PHASE, "start", t, index=self.tracer.step)

    def on_marker(self) -> None:
        self.source = STEP_MARKERS
        self._next()

    def on_optimizer_step(self, optimizer, args, kwargs) -> None:
        self.optimizer_calls += 1
        if self.source == STEP_MARKERS or self.optimizer_calls == 1:
            return
        self.source = STEP_OPTIMIZER
        self._next()


def trace_script(spec: ScriptSpec, options=None, health_options=None) -> ScriptTrace:
    """Run the script under a tracer with training-health checks; returns the trace and outcome."""
    from dataclasses import replace

    from opscope.engine.trace import userapi
    from opscope.engine.trace.capture import Tracer
    from opscope.engine.trace.events import TraceOptions
    from opscope.engine.trace.health import HealthMonitor
    from torch.optim.optimizer import register_optimizer_step_post_hook

    options = replace(options or TraceOptions(), hooks="script")
    tracer = Tracer(options)
    steps = _Steps(tracer)
    monitor = HealthMonitor(tracer, tracer.modules, health_options)
    previous = userapi._install(steps.on_marker)
    handle = register_optimizer_step_post_hook(steps.on_optimizer_step)
    monitor.install()
    try:
        with tracer:
            steps.begin()
            try:
                outcome = run_script(spec)
            finally:
                steps.end()
    finally:
        handle.remove()
        userapi._install(previous)
        monitor.remove()
    health = monitor.findings()
    result = tracer.result()
    result.step_unit = "step"
    return ScriptTrace(spec, result, outcome, steps.source, health, monitor.loss_values(), list(tracer.modules.roots))
