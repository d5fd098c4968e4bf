"""Builds the C++ kernels once per machine kind and caches them in a per-user directory.

The kernels are compiled with torch's own extension tooling for the CPU they run on
(``-march=native``: AVX-512/VNNI where present, AVX2 or plain code elsewhere). The cache key is a
hash of the source, the flags, torch's version and the CPU's feature flags, so a build made on one
kind of CPU is never loaded on another. A cached build is imported directly, without running the
compiler or ninja, which keeps model load fast.
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import logging
import platform
import re
import shutil
import sys
import threading
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from types import ModuleType

from opscope.engine.core.errors import BackendError

log = logging.getLogger(__name__)

_CSRC = Path(__file__).with_name("csrc")
_SOURCES = ("kernels.cpp", "raw.cpp", "raw_q8.cpp", "ops.cpp", "decode.cpp", "prefill.cpp")
_HEADERS = ("qkernels.h", "qtensors.h", "gguf_types.h", "simd_v1.h", "simd_v2.h")
_CFLAGS = ("-O3", "-march=native", "-fopenmp", "-ffp-contract=fast")
_LDFLAGS = ("-fopenmp",)
_lock = threading.Lock()


class KernelBuildError(BackendError):
    """The fast-path kernels cannot be built here (no C++ compiler, a compile error)."""


def cache_root() -> Path:
    """``$OPSCOPE_KERNEL_CACHE``, else the per-user cache directory's ``kernels``."""
    import os

    import platformdirs

    if os.environ.get("OPSCOPE_KERNEL_CACHE"):
        return Path(os.environ["OPSCOPE_KERNEL_CACHE"])
    return Path(platformdirs.user_cache_dir("opscope")) / "kernels"


def _cpu_flags() -> str:
    """The CPU's feature flags (Linux: x86 "flags", Arm "Features"), so builds for different CPUs
    never share a cache entry."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def native_bf16() -> bool:
    """Whether the CPU multiplies bfloat16 natively (AVX512-BF16 or AMX on x86, BF16 on Arm), so a
    bf16 GEMM is faster than a float32 one rather than emulated."""
    return bool(set(_cpu_flags().split()) & {"avx512_bf16", "amx_bf16", "bf16"})


def build_key() -> str:
    import torch

    h = hashlib.sha256()
    for name in _SOURCES + _HEADERS:
        h.update((_CSRC / name).read_bytes())
    for part in (" ".join(_CFLAGS + _LDFLAGS).encode(), torch.__version__.encode(),
                 _cpu_flags().encode(), sys.version.encode()):
        h.update(part)
    return h.hexdigest()[:16]


def _import_so(name: str, so: Path) -> ModuleType:
    loader = importlib.machinery.ExtensionFileLoader(name, str(so))
    spec = importlib.util.spec_from_file_location(name, str(so), loader=loader)
    if spec is None:
        raise ImportError(f"cannot import {so}")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _compile(name: str, build_dir: Path) -> ModuleType:
    if shutil.which("c++") is None and shutil.which("g++") is None:
        raise KernelBuildError("no C++ compiler found (c++/g++): install one (e.g. `apt-get install g++`) "
                               "to use the CPU fast path, or run with the dense torch path")
    from torch.utils.cpp_extension import load

    log.info("building CPU kernels %s in %s", name, build_dir)
    build_dir.mkdir(parents=True, exist_ok=True)
    try:
        return load(name=name, sources=[str(_CSRC / n) for n in _SOURCES], extra_cflags=list(_CFLAGS),
                    extra_ldflags=list(_LDFLAGS), build_directory=str(build_dir), verbose=False)
    except (RuntimeError, OSError, ImportError) as e:  # compile/link errors arrive as RuntimeError
        raise KernelBuildError(f"building the CPU kernels in {build_dir} failed: {e}") from e


_failure: KernelBuildError | None = None  # remembered: a failed build is not retried in this process


def _one_line(message: str) -> str:
    """A compiler's output as one log line: the summary (without ninja's "[1/6] c++ ..." command
    line) and the first compiler diagnostic; the whole output goes to the debug log."""
    lines = [x.strip() for x in message.splitlines() if x.strip()]
    if not lines:
        return message.strip()
    head = re.split(r": \[\d+/\d+\] ", lines[0], maxsplit=1)[0]
    diag = next((x for x in lines[1:] if "error:" in x), "") or next((x for x in lines[1:] if "error" in x.lower()), "")
    return f"{head}: {diag}"[:500] if diag else head[:500]


def load_kernels() -> ModuleType:
    """The compiled kernel module (building it on first use); KernelBuildError, with a one-line
    message, for any failure (sources missing from an install, no compiler, a compile or load
    error), so that every caller can fall back to plain torch."""
    global _failure
    if _failure is not None:
        raise _failure
    try:
        return _load_kernels()
    except Exception as e:  # noqa: BLE001 (whatever breaks here, the fallback is plain torch, not a crash)
        log.debug("CPU kernel build failed", exc_info=True)
        detail = str(e) if isinstance(e, KernelBuildError) else f"the CPU kernels cannot be built: {type(e).__name__}: {e}"
        _failure = KernelBuildError(_one_line(detail))
        raise _failure from e


@lru_cache(maxsize=1)
def _load_kernels() -> ModuleType:
    import torch  # noqa: F401  (the extension links against torch's libraries, loaded first)

    name = f"opscope_qlinear_{build_key()}"
    build_dir = cache_root() / name
    so = build_dir / f"{name}{importlib.machinery.EXTENSION_SUFFIXES[0]}"
    alt = build_dir / f"{name}.so"
    with _lock:
        module = _import_cached(name, so, alt)
        if module is not None:
            return module
        with _machine_lock(build_dir):  # one build per machine; the others wait, then import it
            module = _import_cached(name, so, alt)
            if module is not None:
                return module
            _drop_stale_torch_lock(build_dir)
            with _announced():
                return _compile(name, build_dir)


@contextmanager
def _announced():
    """A build takes minutes and the compiler is silent: say when it starts and ends (engine.progress)."""
    from opscope.engine.core import progress
    from opscope.engine.core.clock import now_ns

    progress.log.info("building CPU kernels for this machine (first run only, a few minutes)…")
    t0, ok = now_ns(), False
    try:
        yield
        ok = True
    finally:
        took = f"{(now_ns() - t0) / 1e9:.0f} s"
        progress.log.info(f"CPU kernels built in {took}" if ok else f"building CPU kernels failed after {took}")


def _import_cached(name: str, *paths: Path) -> ModuleType | None:
    for path in paths:
        if path.is_file():
            try:
                return _import_so(name, path)
            except ImportError as e:  # a half-written or stale file: rebuild it
                log.warning("cached kernel %s does not load (%s); rebuilding", path, e)
    return None


@contextmanager
def _machine_lock(build_dir: Path):
    """An flock beside the build directory: the kernel releases it when its holder dies, unlike the
    `lock` file torch's cpp_extension leaves behind when a build is killed (every later build would
    wait on that file forever)."""
    import fcntl

    build_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(build_dir.parent / f"{build_dir.name}.flock", "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _drop_stale_torch_lock(build_dir: Path) -> None:
    """Holding the machine lock, no other OpScope process is building here: a torch `lock` file
    left in the directory is from a build that was killed."""
    stale = build_dir / "lock"
    if stale.exists():
        log.warning("removing %s left by an interrupted kernel build", stale)
        stale.unlink(missing_ok=True)
