"""llama.cpp's own ``llama-bench`` as a measuring peer: find the binary, run it, read its JSON.

The binary is looked up in this order: an explicit path (the peers suite's ``llama_bench``
parameter), the ``OPSCOPE_LLAMA_BENCH`` environment variable, ``llama-bench`` on PATH. One call
runs ``llama-bench -m FILE -p P -n N -t T -r R -o json`` in a child process; its figures are
llama-bench's own per-repetition samples (warm-up and model load excluded, as llama-bench does),
and the child's peak RSS comes from ``os.wait4`` (that child only, not every child so far).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from opscope.engine.core.errors import ConfigError

ENV_VAR = "OPSCOPE_LLAMA_BENCH"
BINARY = "llama-bench"
RUN_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class LlamaBenchRun:
    """One llama-bench invocation: seconds per repetition of its pp and tg tests, peak RSS."""

    pp_s: tuple[float, ...] = ()
    tg_s: tuple[float, ...] = ()
    n_prompt: int = 0
    n_gen: int = 0
    peak_rss_bytes: int | None = None
    wall_s: float = 0.0
    info: dict = field(default_factory=dict)  # build, cpu, model type and size as llama-bench saw them
    pp_avg_ts: float | None = None  # llama-bench's own figure for each test (the mean of n/t over its reps)
    tg_avg_ts: float | None = None


def find_binary(explicit: str | None = None) -> Path | None:
    """The llama-bench to use, or None when none is set and none is on PATH.

    A path that is given (argument or environment) but does not exist is a ConfigError: a typo must
    not silently fall back to another binary."""
    for given, where in ((explicit, "the llama_bench parameter"), (os.environ.get(ENV_VAR), ENV_VAR)):
        if given:
            path = Path(given).expanduser()
            if not path.is_file():
                raise ConfigError(
                    f"llama-bench not found at {path} (set by {where}); give the path of a llama-bench binary"
                )
            if not os.access(path, os.X_OK):
                raise ConfigError(f"llama-bench at {path} (set by {where}) is not executable; chmod +x it")
            return path
    on_path = shutil.which(BINARY)
    return Path(on_path) if on_path else None


def check_binary(path: Path) -> str:
    """The binary's ``--version`` line; ConfigError when it does not start (wrong CPU, missing libs)."""
    try:
        proc = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=60)
    except OSError as e:
        raise ConfigError(f"llama-bench at {path} does not start: {e}") from e
    except subprocess.TimeoutExpired as e:
        raise ConfigError(f"llama-bench at {path} did not answer --version within 60 s") from e
    text = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0 or "version" not in text:
        last = text.splitlines()[-1] if text else f"exit status {proc.returncode}"
        raise ConfigError(
            f"llama-bench at {path} does not run (--version: {last}); rebuild it "
            f"(see its BUILD.md) or point {ENV_VAR} at a working one"
        )
    return next((ln for ln in text.splitlines() if "version" in ln), text.splitlines()[0])


def command(binary: Path, model: Path, n_prompt: int, n_gen: int, threads: int, reps: int = 1) -> list[str]:
    return [
        str(binary),
        "-m",
        str(model),
        "-p",
        str(n_prompt),
        "-n",
        str(n_gen),
        "-t",
        str(threads),
        "-r",
        str(reps),
        "-o",
        "json",
    ]


def run(
    binary: Path,
    model: Path,
    n_prompt: int,
    n_gen: int,
    threads: int,
    reps: int = 1,
    timeout_s: float = RUN_TIMEOUT_S,
    env: dict | None = None,
) -> LlamaBenchRun:
    """Run llama-bench once (``n_prompt``/``n_gen`` 0 skips that test); RuntimeError on failure.
    ``env``: the child's environment (default: this process's)."""
    child = run_child(command(binary, model, n_prompt, n_gen, threads, reps), timeout_s, env=env)
    if child.status != 0:
        tail = " | ".join(child.stderr.strip().splitlines()[-3:]) or f"exit status {child.status}"
        raise RuntimeError(f"llama-bench failed on {model.name} (exit {child.status}): {tail}")
    return parse(child.stdout, child.peak_rss_bytes, child.wall_s)


@dataclass(frozen=True)
class ChildRun:
    status: int
    stdout: str
    stderr: str
    peak_rss_bytes: int | None  # this child's own peak RSS (its rusage from os.wait4)
    wall_s: float


def run_child(argv: list[str], timeout_s: float = RUN_TIMEOUT_S, env: dict | None = None) -> ChildRun:
    """Run ``argv`` to completion and return its output and its own peak RSS (not the max over every
    child this process ever had, which is what RUSAGE_CHILDREN gives)."""
    import time

    t0 = time.monotonic()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env)
        status, rusage = _wait(proc, timeout_s)
        wall = time.monotonic() - t0
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    return ChildRun(status, stdout, stderr, rusage.ru_maxrss * 1024 if rusage else None, wall)


def _wait(proc: subprocess.Popen, timeout_s: float):
    """(exit status, rusage of this child alone): os.wait4 reaps it, so Popen must not."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, rusage
        if time.monotonic() > deadline:
            proc.kill()
            os.wait4(proc.pid, 0)
            proc.returncode = -9
            exe = proc.args[0] if isinstance(proc.args, (list, tuple)) else proc.args
            raise RuntimeError(f"{Path(os.fsdecode(str(exe))).name} ran past {timeout_s:.0f} s and was killed")
        time.sleep(0.02)


def parse(stdout: str, peak_rss_bytes: int | None = None, wall_s: float = 0.0) -> LlamaBenchRun:
    """llama-bench's ``-o json`` output (a list, one entry per test) → LlamaBenchRun."""
    try:
        tests = json.loads(stdout)
    except json.JSONDecodeError as e:
        raise RuntimeError(f"llama-bench printed no JSON ({e}): {stdout[:200]!r}") from e
    pp, tg, n_prompt, n_gen, info, avg = (), (), 0, 0, {}, {}
    for t in tests:
        seconds = tuple(ns / 1e9 for ns in t["samples_ns"])
        if t["n_gen"] == 0 and t["n_prompt"] > 0:
            pp, n_prompt, avg["pp"] = seconds, t["n_prompt"], t.get("avg_ts")
        elif t["n_prompt"] == 0 and t["n_gen"] > 0:
            tg, n_gen, avg["tg"] = seconds, t["n_gen"], t.get("avg_ts")
        info = {
            k: t.get(k)
            for k in (
                "build_commit",
                "build_number",
                "cpu_info",
                "model_type",
                "model_size",
                "model_n_params",
                "n_threads",
                "type_k",
                "type_v",
            )
        }
    return LlamaBenchRun(pp, tg, n_prompt, n_gen, peak_rss_bytes, wall_s, info, avg.get("pp"), avg.get("tg"))
