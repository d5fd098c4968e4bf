"""Loads the C++ kernels of the CPU variant this process runs (engine.kernels.variants).

Each variant is compiled ahead of time (``make setup`` for a checkout: the variants this CPU runs,
``opscope fastpath build --runnable``; ``make dist`` for the wheel: all, ``--all``) into
``prebuilt/<torch+python tag>/`` beside
this file, so the user needs no compiler. Where no prebuilt library fits (another torch, a source
change, a platform no variant was built for) the variant is compiled at first use with torch's
extension tooling into a per-user cache, as before. The key of a build is a hash of the sources,
the variant's flags, torch's and Python's versions: a library never runs with other sources or
on a CPU its variant does not fit. A found library is imported directly, without the compiler.
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
from opscope.engine.fastpath.kernels import variants
from opscope.engine.fastpath.kernels.variants import Variant

log = logging.getLogger(__name__)

# The library's sources, headers and flags (public: packaging/cross_kernels.py builds them for ARM64).
CSRC = Path(__file__).with_name("csrc")
SOURCES = ("kernels.cpp", "raw.cpp", "raw_q8.cpp", "torch_unity.cpp")
_HEADERS = (
    "ops.cpp",  # these three are compiled as one unit, torch_unity.cpp
    "decode.cpp",
    "prefill.cpp",
    "qkernels.h",
    "qtensors.h",
    "gguf_types.h",
    "simd_v1.h",
    "simd_v2.h",
    "vec.h",
    "portable.h",
    "pool.h",
    "int8.h",
    "vec_int8.h",
)
_CFLAGS = ("-O3", "-fopenmp", "-ffp-contract=fast")  # + the variant's -m flags
LDFLAGS = ("-fopenmp",)
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


def loaded_variant() -> str | None:
    """The name of the variant whose kernels this process has loaded (None: none loaded yet, or
    the load failed)."""
    return _loaded_variant


def variant() -> Variant:
    """The variant this process loads (VariantError, a KernelBuildError's sibling, where
    OPSCOPE_CPU_VARIANT names one this CPU cannot run)."""
    return variants.chosen()


def cflags(v: Variant) -> list[str]:
    return list(_CFLAGS + v.cflags)


def _compiled_from(v: Variant) -> hashlib._Hash:
    """A hash of the sources, headers, variant and flags (what both keys below start from)."""
    h = hashlib.sha256()
    for name in SOURCES + _HEADERS:
        h.update((CSRC / name).read_bytes())
    h.update(v.name.encode())
    h.update(" ".join(cflags(v) + list(LDFLAGS)).encode())
    return h


def build_key(v: Variant | None = None) -> str:
    """sources_key plus this torch and this exact Python: a user-cache build's name."""
    import torch

    h = _compiled_from(v or variant())
    h.update(torch.__version__.encode())
    h.update(sys.version.encode())
    return h.hexdigest()[:16]


def module_name(v: Variant | None = None) -> str:
    v = v or variant()
    return f"opscope_qlinear_{v.name.replace('-', '_')}_{build_key(v)}"


def abi_tag() -> str:
    """The prebuilt libraries' folder: they link against this torch and this Python."""
    import torch

    return f"torch{torch.__version__.split('+')[0]}-{sys.implementation.cache_tag}-{variants.arch()}"


def prebuilt_root() -> Path:
    """``$OPSCOPE_KERNEL_PREBUILT``, else ``prebuilt`` beside this file (in the wheel, in a checkout
    after ``make setup``)."""
    import os

    if os.environ.get("OPSCOPE_KERNEL_PREBUILT"):
        return Path(os.environ["OPSCOPE_KERNEL_PREBUILT"])
    return Path(__file__).with_name("prebuilt")


def prebuilt_path(v: Variant | None = None) -> Path:
    v = v or variant()
    return prebuilt_root() / abi_tag() / f"{module_name(v)}{importlib.machinery.EXTENSION_SUFFIXES[0]}"


def sources_key(v: Variant) -> str:
    """The hash of what a prebuilt library was compiled from (sources, variant, flags): the folder
    it sits in (abi_tag) says which torch and CPython ABI it needs, so a Python of another patch
    release (3.11.2 vs 3.11.7: another build_key) still loads it."""
    return _compiled_from(v).hexdigest()[:16]


_MANIFEST = "manifest.json"


def prebuilt_entry(v: Variant) -> tuple[str, Path] | None:
    """(module name, library) of the prebuilt variant ``v`` for these sources, or None."""
    exact = prebuilt_path(v)
    if exact.is_file():
        return module_name(v), exact
    import json

    manifest = prebuilt_root() / abi_tag() / _MANIFEST
    try:
        entry = json.loads(manifest.read_text()).get(v.name)
    except (OSError, ValueError):
        return None
    if not entry or entry.get("sources") != sources_key(v):
        return None
    path = manifest.parent / entry["file"]
    return (entry["module"], path) if path.is_file() else None


def record_prebuilt(v: Variant, dest: Path) -> None:
    """Add ``dest`` (variant ``v``, these sources) to its folder's manifest (prebuild's children
    add theirs side by side: read, change and replace under a lock)."""
    import fcntl
    import json
    import os

    manifest = dest.parent / _MANIFEST
    folder = os.open(dest.parent, os.O_RDONLY)  # the lock: the folder itself, no file left in it
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        try:
            data = json.loads(manifest.read_text())
        except (OSError, ValueError):
            data = {}
        data[v.name] = {"module": module_name(v), "file": dest.name, "sources": sources_key(v)}
        tmp = manifest.with_name(f".{_MANIFEST}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        tmp.replace(manifest)
    finally:
        os.close(folder)  # closing the descriptor releases the lock


def library_origin(v: Variant | None = None) -> str:
    """Where variant ``v``'s library comes from here: prebuilt, the per-user cache, or a compile
    at first use (a few minutes; needs a C++ compiler)."""
    v = v or variant()
    name = module_name(v)
    pre = prebuilt_entry(v)
    if pre is not None:
        return f"prebuilt: {pre[1]}"
    cached = [p for p in (cache_root() / name).glob(f"{name}*.so")]
    if cached:
        return f"compiled here: {cached[0]}"
    return f"not built yet: compiled at first use into {cache_root() / name} (a few minutes, needs a C++ compiler)"


def _import_so(name: str, so: Path) -> ModuleType:
    loader = importlib.machinery.ExtensionFileLoader(name, str(so))
    spec = importlib.util.spec_from_file_location(name, str(so), loader=loader)
    if spec is None:
        raise ImportError(f"cannot import {so}")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _compile(name: str, build_dir: Path, v: Variant) -> ModuleType:
    if shutil.which("c++") is None and shutil.which("g++") is None:
        raise KernelBuildError(
            "no C++ compiler found (c++/g++): install one (e.g. `apt-get install g++`) "
            "to use the CPU fast path, or run with the dense torch path"
        )
    from torch.utils.cpp_extension import load

    log.info("building CPU kernels %s in %s", name, build_dir)
    build_dir.mkdir(parents=True, exist_ok=True)
    try:
        return load(
            name=name,
            sources=[str(CSRC / n) for n in SOURCES],
            extra_cflags=cflags(v),
            extra_ldflags=list(LDFLAGS),
            build_directory=str(build_dir),
            verbose=False,
        )
    except (RuntimeError, OSError, ImportError) as e:  # compile/link errors arrive as RuntimeError
        raise KernelBuildError(f"building the CPU kernels in {build_dir} failed: {e}") from e


_failure: KernelBuildError | None = None  # remembered: a failed build is not retried in this process
_loaded_variant: str | None = None


def one_line(message: str) -> str:
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
    global _loaded_variant
    try:
        module = _load_kernels()
        _loaded_variant = variant().name
        return module
    except Exception as e:
        log.debug("CPU kernel build failed", exc_info=True)
        plain = isinstance(e, (KernelBuildError, variants.VariantError))
        detail = str(e) if plain else f"the CPU kernels cannot be built: {type(e).__name__}: {e}"
        _failure = KernelBuildError(one_line(detail))
        raise _failure from e


@lru_cache(maxsize=1)
def _load_kernels() -> ModuleType:
    import torch  # noqa: F401  (the extension links against torch's libraries, loaded first)

    v = variant()
    name = module_name(v)
    build_dir = cache_root() / name
    so = build_dir / f"{name}{importlib.machinery.EXTENSION_SUFFIXES[0]}"
    alt = build_dir / f"{name}.so"
    with _lock:
        pre = prebuilt_entry(v)
        module = _import_cached(pre[0], pre[1]) if pre else None
        module = module or _import_cached(name, so, alt)
        if module is not None:
            log.info("CPU kernels: %s", variants.reason(v))
            return module
        with _machine_lock(build_dir):  # one build per machine; the others wait, then import it
            module = _import_cached(name, so, alt)
            if module is not None:
                return module
            _drop_stale_torch_lock(build_dir)
            with _announced():
                return _compile(name, build_dir, v)


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


def build_variant(v: Variant, out_root: Path) -> Path:
    """Compile variant ``v`` (in this process: one variant per process, each registers the same
    torch operator namespace) and copy its library to ``out_root/<abi tag>/``."""
    name = module_name(v)
    build_dir = cache_root() / name
    so = build_dir / f"{name}{importlib.machinery.EXTENSION_SUFFIXES[0]}"
    alt = build_dir / f"{name}.so"
    if not (so.is_file() or alt.is_file()):
        with _machine_lock(build_dir):
            _drop_stale_torch_lock(build_dir)
            _compile(name, build_dir, v)
    dest = out_root / abi_tag() / f"{name}{importlib.machinery.EXTENSION_SUFFIXES[0]}"
    dest.parent.mkdir(parents=True, exist_ok=True)
    prefix = name.rsplit("_", 1)[0] + "_"
    for stale in dest.parent.glob(f"{prefix}*"):  # this variant built from older sources (not avx512 vs avx512_vnni)
        key = stale.name[len(prefix) :].split(".", 1)[0]
        if stale != dest and len(key) == 16 and "_" not in key:
            stale.unlink()
    tmp = dest.with_name(f".{dest.name}.tmp")
    shutil.copyfile(so if so.is_file() else alt, tmp)
    tmp.replace(dest)  # a new file: a process that has the old one mapped keeps it
    record_prebuilt(v, dest)
    return dest


def prebuild(out_root: Path, names: list[str] | None = None) -> list[str]:
    """Every variant of this architecture (or ``names``) compiled ahead of time into
    ``out_root``, one child process each; the lines to print.

    The children run side by side, one per core at most, and share the cores out (torch's
    MAX_JOBS): a variant's compile is one large unit and three small ones, so one variant at a time
    leaves a core idle for most of it. The large unit takes ~1.2 GB of memory to compile: no more
    children than 1.5 GB each of the memory available."""
    import os
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

    import psutil

    todo = [variants.by_name(n) for n in names] if names else variants.for_arch()
    cores = os.cpu_count() or 1
    fit = psutil.virtual_memory().available // (1536 << 20)
    side_by_side = max(1, min(len(todo), cores, fit))
    jobs = os.environ.get("MAX_JOBS") or str(max(1, cores // side_by_side))  # a user's own limit stands
    env = {**os.environ, variants.ENV: "", "MAX_JOBS": jobs}
    # A child that fails says why in its last line of stderr (one line, as load_kernels words it).
    code = (
        "import sys; from pathlib import Path; from opscope.engine.fastpath.kernels import build, variants\n"
        "try: print(build.build_variant(variants.by_name(sys.argv[1]), Path(sys.argv[2])))\n"
        "except build.KernelBuildError as e: sys.exit(build.one_line(str(e)))"
    )

    def one(v: Variant) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-c", code, v.name, str(out_root)]
        return subprocess.run(cmd, capture_output=True, text=True, env=env)

    with ThreadPoolExecutor(side_by_side) as pool:
        done = list(pool.map(one, todo))
    lines = []
    for v, out in zip(todo, done):
        if out.returncode != 0:
            why = ([x for x in out.stderr.splitlines() if x.strip()] or [f"exit status {out.returncode}"])[-1]
            raise KernelBuildError(f"building kernel variant {v.name} failed: {why.strip()}")
        lines.append(f"{v.name}: {out.stdout.strip().splitlines()[-1]}")
    return lines


if __name__ == "__main__":  # python -m opscope.engine.fastpath.kernels.build [--out DIR] [VARIANT ...]
    import argparse

    ap = argparse.ArgumentParser(description="compile the kernel variants ahead of time")
    ap.add_argument("--out", default=str(prebuilt_root()), metavar="DIR", help="default: the package's prebuilt/")
    ap.add_argument("variants", nargs="*", help="default: every variant of this architecture")
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO)
    for line in prebuild(Path(a.out), a.variants or None):
        print(line)
