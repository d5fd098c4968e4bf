"""Loads the C++ kernels of the CPU variant this process runs (engine.kernels.variants).

Each variant is compiled ahead of time (``make setup`` for a checkout: the variants this CPU runs,
``opscope fastpath build --runnable``; ``make dist`` for the wheel: all, ``--all``) into
``prebuilt/torch<minor release>-<arch>/`` beside
this file, so the user needs no compiler. Where no prebuilt library fits (another torch, a source
change, a platform no variant was built for) the variant is compiled at first use into a per-user
cache (toolchain.py drives the compiler). The key of a build is a hash of the sources,
the variant's flags and torch's version: a library never runs with other sources or on a CPU its
variant does not fit. A library is a plain shared library over torch's C++ libraries (its
operators and the decode step's class registered with torch's dispatcher), so any Python that runs
that torch loads it; a found library is loaded directly, without the compiler.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import shutil
import sys
import threading
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

from opscope.engine.fastpath.kernels import cache as cache_mod
from opscope.engine.fastpath.kernels import toolchain, variants
from opscope.engine.fastpath.kernels.toolchain import KernelBuildError, Toolchain, Unit
from opscope.engine.fastpath.kernels.variants import Variant

log = logging.getLogger(__name__)

# The library's sources, headers and flags (public: packaging/cross_kernels.py builds them for ARM64).
# A variant's own units are compiled with its flags; the torch-facing half (the operators, the
# decode step, the prefill: torch_unity.cpp, most of the compile time) once per platform and torch,
# with the architecture's baseline flags, and linked into every variant's library.
CSRC = Path(__file__).with_name("csrc")
VARIANT_SOURCES = ("kernels.cpp", "raw.cpp", "raw_q8.cpp", "rowwork.cpp", "entry.cpp")
SUFFIX = ".so"  # a plain shared library, loaded with ctypes (_import_so): no Python ABI tag
TORCH_HALF = "torch_unity.cpp"
SOURCES = (*VARIANT_SOURCES, TORCH_HALF)
_HEADERS = (
    "ops.cpp",  # these three are compiled as one unit, torch_unity.cpp
    "decode.cpp",
    "prefill.cpp",
    "qkernels.h",
    "qtensors.h",
    "rowwork.h",
    "gguf_types.h",
    "gguf_ids.h",
    "simd_v1.h",
    "simd_v2.h",
    "vec.h",
    "portable.h",
    "pool.h",
    "int8.h",
    "vec_int8.h",
)
_CFLAGS = ("-O3", "-ffp-contract=fast")  # + the variant's -m flags and the OS's (toolchain.Platform)
_lock = threading.Lock()


def cache_root() -> Path:
    """``$OPSCOPE_KERNEL_CACHE``, else the per-user cache directory's ``kernels``."""
    import os

    import platformdirs

    if os.environ.get("OPSCOPE_KERNEL_CACHE"):
        return Path(os.environ["OPSCOPE_KERNEL_CACHE"])
    return Path(platformdirs.user_cache_dir("opscope")) / "kernels"


# oneDNN ISA caps (ONEDNN_MAX_CPU_ISA) below its first one with bf16 dot products (AVX512_CORE_BF16)
_ONEDNN_NO_BF16 = frozenset({"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX512_CORE", "AVX512_CORE_VNNI"})


def native_bf16() -> bool:
    """Whether bfloat16 GEMMs run natively here (AVX512-BF16 or AMX on x86, BF16 on Arm), so a bf16
    GEMM is faster than a float32 one rather than emulated: the CPU has it and oneDNN, which runs
    them, is not capped below it (ONEDNN_MAX_CPU_ISA, as when an AVX2 CPU is stood in for)."""
    import os

    cap = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").strip().upper()
    return cap not in _ONEDNN_NO_BF16 and bool(variants.cpu_flags() & {"avx512_bf16", "amx_bf16", "bf16"})


def int8_prefill() -> bool:
    """Whether the kernels this process loads have the int8 prefill GEMM (every variant with int8
    kernels): the int8-activation mode's prefill then runs in int8 too. Asks the
    library itself (loading it), so a variant forced by OPSCOPE_CPU_VARIANT answers for itself."""
    import torch

    try:
        load_kernels()
        return torch.ops.opscope.int8_prefill_group(16 + 2, 32, 16) > 0  # raw Q4_0, one panel
    except (KernelBuildError, AttributeError, RuntimeError):
        return False


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


def half_cflags(arch: str) -> list[str]:
    """The torch half's flags: the architecture's baseline variant's (it holds no vector code)."""
    return cflags(variants.for_arch(arch)[-1])


@lru_cache(maxsize=8)
def _hashed(csrc: Path, names: tuple[str, ...]) -> hashlib._Hash:
    h = hashlib.sha256()
    for name in names:
        h.update((csrc / name).read_bytes())
    return h


def _sources_hash() -> hashlib._Hash:
    """A hash of the sources and headers, read once per process (a start-up asks for several keys)."""
    return _hashed(CSRC, SOURCES + _HEADERS).copy()


def _compiled_from(v: Variant) -> hashlib._Hash:
    """A hash of the sources, headers, variant and flags (what both keys below start from)."""
    h = _sources_hash()
    h.update(v.name.encode())
    h.update(" ".join(cflags(v) + half_cflags(v.arch) + toolchain.common_flags() + [sys.platform]).encode())
    return h


def build_key(v: Variant | None = None) -> str:
    """sources_key plus this torch's exact version: a user-cache build's name."""
    import torch

    h = _compiled_from(v or variant())
    h.update(torch.__version__.encode())
    return h.hexdigest()[:16]


def module_name(v: Variant | None = None) -> str:
    v = v or variant()
    return f"opscope_qlinear_{v.name.replace('-', '_')}_{build_key(v)}"


def torch_series(version: str) -> str:
    """``2.14`` of ``2.14.1+cu130``: the releases one prebuilt library serves. torch's patch releases
    keep its C++ ABI (extension wheels such as xformers' and flash-attn's are built per minor
    release); a library built against 2.14.1 was checked in 2.14.0 (docs/decisions/cpu-variants.md)."""
    return ".".join(version.split("+")[0].split(".")[:2])


def prebuilt_folder(torch_version: str, arch: str, system: str = "linux") -> str:
    """The prebuilt folder of ``arch``'s libraries for torch ``torch_version``'s minor release on
    ``system`` (sys.platform's name): Linux's plain, another OS's named (an Apple Silicon Mac must
    not take Linux's aarch64 libraries for its own)."""
    return f"torch{torch_series(torch_version)}-{platform_tag(arch, system)}"


def platform_tag(arch: str, system: str) -> str:
    return arch if system.startswith("linux") else f"{arch}-{'macos' if system == 'darwin' else system}"


def abi_tag() -> str:
    """The prebuilt libraries' folder for this process: they link against this torch's minor release
    (and no Python)."""
    import torch

    return prebuilt_folder(torch.__version__, variants.arch(), sys.platform)


def prebuilt_root() -> Path:
    """``$OPSCOPE_KERNEL_PREBUILT``, else ``prebuilt`` beside this file (in the wheel, in a checkout
    after ``make setup``)."""
    import os

    if os.environ.get("OPSCOPE_KERNEL_PREBUILT"):
        return Path(os.environ["OPSCOPE_KERNEL_PREBUILT"])
    return Path(__file__).with_name("prebuilt")


def prebuilt_path(v: Variant | None = None) -> Path:
    v = v or variant()
    return prebuilt_root() / abi_tag() / f"{module_name(v)}{SUFFIX}"


def sources_key(v: Variant) -> str:
    """The hash of what a prebuilt library was compiled from (sources, variant, flags): the folder
    it sits in (abi_tag) says which torch it needs, so a build of another torch patch release (2.13.0
    vs 2.13.0+cpu: another build_key) still loads it."""
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
    others = prebuilt_for_other_torch()
    carried = f"; prebuilt here only for {', '.join(others)}" if others else ""
    return f"not built yet: compiled at first use into {cache_root() / name} (a few minutes, needs a C++ compiler){carried}"


def prebuilt_for_other_torch() -> list[str]:
    """The torch releases (``torch2.14``) with prebuilt libraries for this architecture other than the
    one running: a library loads only into the torch (minor release) it was compiled against."""
    import re

    mine, root = abi_tag(), prebuilt_root()
    form = re.compile(rf"(torch[0-9][0-9.]*)-{re.escape(platform_tag(variants.arch(), sys.platform))}")
    found = root.iterdir() if root.is_dir() else []
    return sorted(m[1] for p in found if (m := form.fullmatch(p.name)) and p.name != mine and (p / _MANIFEST).is_file())


class Kernels:
    """The loaded kernel library: its operators (``torch.ops.opscope.<name>``) and the decode step's
    class (``torch.classes.opscope.DecodeModel``), under the names the engine calls them by."""

    _ALIASES = {"embedding": "qembedding"}

    def __init__(self, name: str, path: Path, library: ctypes.CDLL) -> None:
        self.__name__, self.__file__, self.library = name, str(path), library

    @property
    def DecodeModel(self):
        import torch

        return torch.classes.opscope.DecodeModel

    def __getattr__(self, name: str):
        import torch

        return getattr(torch.ops.opscope, self._ALIASES.get(name, name))


def _import_so(name: str, so: Path) -> Kernels:
    """Load library ``so``, built as ``name`` (its static initialisers register the operators and
    the class with torch's dispatcher); ImportError where the file is not that library."""
    import torch

    try:
        library = ctypes.CDLL(str(so))
        library.opscope_kernel_library.restype = ctypes.c_char_p
        built_as = library.opscope_kernel_library().decode()
    except (OSError, AttributeError) as e:
        raise ImportError(f"cannot load {so}: {e}") from e
    if built_as != name:
        raise ImportError(f"{so} is the library {built_as}, not {name}")
    torch.ops.loaded_libraries.add(str(so))  # as torch.ops.load_library records it
    return Kernels(name, so, library)


def _workers() -> int:
    """Units compiled side by side: one per core (a user's MAX_JOBS stands), and no more than one
    per 1.5 GB of available memory (the torch half takes ~1.2 GB to compile)."""
    import os

    import psutil

    if os.environ.get("MAX_JOBS", "").isdigit():
        return max(1, int(os.environ["MAX_JOBS"]))
    return max(1, min(os.cpu_count() or 1, psutil.virtual_memory().available // (1536 << 20)))


def half_unit(tc: Toolchain, arch: str, cache: Path) -> Unit:
    """The torch half's object for this toolchain and architecture, shared by every variant."""
    h = _sources_hash()
    h.update(" ".join([*half_cflags(arch), *tc.flags, *tc.platform.openmp, tc.tag]).encode())
    key = h.hexdigest()[:16]
    return Unit(
        CSRC / TORCH_HALF,
        tuple(half_cflags(arch)),
        cache / f"opscope_torch_half_{arch}_{key}" / f"{Path(TORCH_HALF).stem}.o",
    )


def variant_units(v: Variant, name: str, work: Path, extra: tuple[str, ...] = ()) -> list[Unit]:
    """Variant ``v``'s own units, compiled into ``work`` as the library ``name`` (entry.cpp says it)."""
    flags = (*cflags(v), *extra, f"-DTORCH_EXTENSION_NAME={name}")
    return [Unit(CSRC / src, flags, work / f"{Path(src).stem}.o") for src in VARIANT_SOURCES]


def compile_variants(
    tc: Toolchain, todo: list[tuple[Variant, str, Path]], cache: Path, extra: tuple[str, ...] = ()
) -> dict[str, Path]:
    """The libraries of ``todo`` (variant, module name, build directory), each at
    ``<directory>/<name>.so``: the torch half first (the longest unit), then every
    variant's units, side by side, then the links. A library already there is kept."""
    out = {v.name: d / f"{n}{SUFFIX}" for v, n, d in todo}
    todo = [(v, n, d) for v, n, d in todo if not out[v.name].is_file()]
    halves = {v.arch: half_unit(tc, v.arch, cache) for v, _, _ in todo}
    units = {v.name: variant_units(v, n, d, extra) for v, n, d in todo}
    toolchain.compile_units(tc, [*halves.values(), *(u for us in units.values() for u in us)], _workers())
    for v, _, _ in todo:
        objs = [u.obj for u in units[v.name]] + [halves[v.arch].obj]
        toolchain.link(tc, objs, out[v.name])
    fresh = [d.name for _, _, d in todo if d.parent == cache] + [h.obj.parent.name for h in halves.values()]
    cache_mod.prune(cache, fresh)  # the builds these replace
    return out


def _compile(name: str, build_dir: Path, v: Variant) -> Kernels:
    log.info("building CPU kernels %s in %s", name, build_dir)
    try:
        so = compile_variants(toolchain.host(), [(v, name, build_dir)], cache_root())[v.name]
        return _import_so(name, so)
    except (OSError, ImportError) as e:
        raise KernelBuildError(f"building the CPU kernels in {build_dir} failed: {e}") from e


_failure: KernelBuildError | None = None  # remembered: a failed build is not retried in this process
_loaded_variant: str | None = None


def one_line(message: str) -> str:
    """A build error as one log line: its first line and, where later lines hold one, the first
    compiler diagnostic (the whole message goes to the debug log)."""
    lines = [x.strip() for x in message.splitlines() if x.strip()]
    if not lines:
        return message.strip()
    head = lines[0]
    diag = next((x for x in lines[1:] if "error:" in x), "") or next((x for x in lines[1:] if "error" in x.lower()), "")
    return f"{head}: {diag}"[:500] if diag else head[:500]


def load_kernels() -> Kernels:
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
def _load_kernels() -> Kernels:
    import torch  # noqa: F401  (the extension links against torch's libraries, loaded first)

    v = variant()
    name = module_name(v)
    build_dir = cache_root() / name
    so = build_dir / f"{name}{SUFFIX}"
    with _lock:
        pre = prebuilt_entry(v)
        module = _import_cached(pre[0], pre[1]) if pre else None
        if module is None and (module := _import_cached(name, so)) is not None:
            cache_mod.mark_used(build_dir)
        if module is not None:
            log.info("CPU kernels: %s", variants.reason(v))
            return module
        with _machine_lock(build_dir):  # one build per machine; the others wait, then import it
            module = _import_cached(name, so)
            if module is not None:
                return module
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


def _import_cached(name: str, *paths: Path) -> Kernels | None:
    for path in paths:
        if path.is_file():
            try:
                return _import_so(name, path)
            except ImportError as e:  # a half-written or stale file: rebuild it
                log.warning("cached kernel %s does not load (%s); rebuilding", path, e)
    return None


@contextmanager
def _machine_lock(build_dir: Path):
    """An flock beside the build directory: the kernel releases it when its holder dies (a lock
    file's existence would outlive a killed build, and every later build would wait on it)."""
    import fcntl

    build_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(build_dir.parent / f"{build_dir.name}.flock", "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _install(v: Variant, so: Path, out_root: Path) -> Path:
    """Copy variant ``v``'s library into ``out_root/<abi tag>/`` and record it in the manifest."""
    dest = out_root / abi_tag() / so.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    prefix = module_name(v)[: -cache_mod.KEY_DIGITS]
    for stale in dest.parent.glob(f"{prefix}*"):  # this variant built from older sources
        if stale != dest and cache_mod.of_prefix(stale.name.split(".", 1)[0], prefix):
            stale.unlink()
    tmp = dest.with_name(f".{dest.name}.tmp")
    shutil.copyfile(so, tmp)
    tmp.replace(dest)  # a new file: a process that has the old one mapped keeps it
    record_prebuilt(v, dest)
    return dest


def prebuild(out_root: Path, names: list[str] | None = None) -> list[str]:
    """Every variant of this architecture (or ``names``) compiled ahead of time into
    ``out_root``; the lines to print. The torch half is compiled once for all of them, the
    variants' own units side by side with it (compile_variants)."""
    todo = [variants.by_name(n) for n in names] if names else variants.for_arch()
    if not todo:
        return []
    jobs = [(v, module_name(v), cache_root() / module_name(v)) for v in todo]
    try:
        with contextlib.ExitStack() as locks:  # one build per machine and variant, as at first use
            for _, _, d in jobs:
                locks.enter_context(_machine_lock(d))
            built = compile_variants(toolchain.host(), jobs, cache_root())
    except (KernelBuildError, OSError) as e:
        which = next((v.name for v, n, _ in jobs if n in str(e)), todo[0].name)
        raise KernelBuildError(f"building kernel variant {which} failed: {one_line(str(e))}") from e
    return [f"{v.name}: {_install(v, built[v.name], out_root).resolve()}" for v in todo]


def main(argv: list[str] | None = None) -> int:
    """``make setup`` runs this while pip installs the rest (it needs torch, numpy, psutil and
    platformdirs only): ``main(["--runnable"])``."""
    import argparse

    ap = argparse.ArgumentParser(description="compile the kernel variants ahead of time")
    ap.add_argument("--out", default=str(prebuilt_root()), metavar="DIR", help="default: the package's prebuilt/")
    ap.add_argument("--runnable", action="store_true", help="only the variants this CPU can run")
    ap.add_argument("variants", nargs="*", help="default: every variant of this architecture")
    a = ap.parse_args(argv)
    names = [v.name for v in variants.runnable()] if a.runnable else a.variants
    try:
        for line in prebuild(Path(a.out), names or None):
            print(line)
    except KernelBuildError as e:
        print(f"opscope: {e}", file=sys.stderr)
        return 2
    return 0
