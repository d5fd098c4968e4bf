"""Compiles and links the kernel library: a C++ compiler driven directly, unit by unit.

A variant's library is its own units (compiled with its flags) linked with the torch-facing half,
which is compiled once per platform and torch and shared by every variant (build.py says which
units are which). Objects are named by what they were compiled from and written under a temporary
name, then renamed: a build killed half-way leaves no object that looks finished, and two
processes building the same object both end with a whole one.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from opscope.engine.core.errors import BackendError


class KernelBuildError(BackendError):
    """The fast-path kernels cannot be built here (no C++ compiler, a compile error)."""


@dataclass(frozen=True)
class Platform:
    """What one operating system's compiler and linker take besides the sources: OpenMP (for
    at::parallel_for, which ATen's headers inline into the library), the link's own flags, and nm's
    arguments that list a library's undefined symbols."""

    name: str
    openmp: tuple[str, ...]
    link: tuple[str, ...]
    nm_undefined: tuple[str, ...]


LINUX = Platform("linux", ("-fopenmp",), ("-fopenmp",), ("-DC", "--undefined-only"))
# Apple's clang refuses -fopenmp, but its front end compiles OpenMP (-Xclang -fopenmp) against the
# omp.h that torch's macOS wheel ships; libomp is not linked (its install name is a path on torch's
# build machine): its symbols, like MKL's weak ones (prefill.cpp), bind at load to what the loaded
# torch holds (-undefined dynamic_lookup, as torch's cpp_extension links on macOS). Mach-O has no
# dynamic symbol table for nm -D.
MACOS = Platform("macos", ("-Xclang", "-fopenmp"), ("-undefined", "dynamic_lookup"), ("-C", "-u"))
# macOS with a torch that ships no omp.h: at::parallel_for runs on the calling thread (the decode
# step's own pool is std::thread's).
MACOS_NO_OPENMP = Platform("macos", (), MACOS.link, MACOS.nm_undefined)


def platform_for(system: str, torch_include: list[Path]) -> Platform:
    """The Platform of ``system`` (sys.platform's name) for a torch whose headers are ``torch_include``."""
    if system == "darwin":
        return MACOS if any((d / "omp.h").is_file() for d in torch_include) else MACOS_NO_OPENMP
    return LINUX


@dataclass(frozen=True)
class Toolchain:
    """A compiler and what building against one torch takes: the flags of every unit (torch's
    headers), the link line's tail (torch's libraries), the tool that lists symbols, the OS's flags."""

    cxx: str
    flags: tuple[str, ...]
    libs: tuple[str, ...]
    nm: str | None
    tag: str  # what the objects depend on besides the sources and flags (torch, target)
    platform: Platform = LINUX


@dataclass(frozen=True)
class Unit:
    src: Path
    flags: tuple[str, ...]
    obj: Path


NO_COMPILER = (
    "no C++ compiler found (c++/g++): install one (e.g. `apt-get install g++`) "
    "to use the CPU fast path, or run with the dense torch path"
)
NO_XCODE_TOOLS = (
    "no C++ compiler: Xcode's command line tools are not installed (`xcode-select --install`) "
    "to use the CPU fast path, or run with the dense torch path"
)


def host() -> Toolchain:
    """This machine's compiler, against the torch running this process."""
    import sys

    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        raise KernelBuildError(NO_COMPILER)
    if sys.platform == "darwin" and not _xcode_tools():
        raise KernelBuildError(NO_XCODE_TOOLS)  # /usr/bin/c++ is then a stub that opens an installer
    import torch
    from torch.utils import cpp_extension

    include = [Path(p) for p in cpp_extension.include_paths()]
    lib = Path(torch.__file__).parent / "lib"
    abi = bool(torch._C._GLIBCXX_USE_CXX11_ABI)
    return against_torch(cxx, include, lib, sys.platform, shutil.which("nm"), torch.__version__, abi)


def against_torch(
    cxx: str, include: list[Path], lib: Path, system: str, nm: str | None, tag: str, cxx11_abi: bool = True
) -> Toolchain:
    """Compiler ``cxx`` building for ``system`` (sys.platform's name) against the torch whose headers
    are ``include`` and whose libraries are in ``lib`` (this machine's, or a wheel's for another)."""
    flags = [f for inc in include for f in ("-isystem", str(inc))]
    flags += common_flags()
    flags.append(f"-D_GLIBCXX_USE_CXX11_ABI={int(cxx11_abi)}")
    libs = [f"-L{lib}", "-lc10", "-ltorch_cpu", "-ltorch"]  # not torch_python: no Python in the library
    if system == "darwin":  # torch's libraries are @rpath/ names: where to find them
        libs.append(f"-Wl,-rpath,{lib}")
    return Toolchain(cxx, tuple(flags), tuple(libs), nm, tag, platform_for(system, include))


def _xcode_tools() -> bool:
    try:
        return subprocess.run(["xcode-select", "-p"], capture_output=True).returncode == 0
    except OSError:
        return False


def common_flags() -> list[str]:
    """What torch's cpp_extension passes every unit of an extension (besides the include paths)."""
    return ["-DTORCH_API_INCLUDE_EXTENSION_H", "-fPIC", "-std=c++20"]


def _tmp(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")


def first_diagnostic(output: str) -> str:
    lines = [x.strip() for x in output.splitlines() if x.strip()]
    return (
        next((x for x in lines if "error:" in x), "")
        or next((x for x in lines if "error" in x.lower()), "")
        or (lines[0] if lines else "no output")
    )


def compile_unit(tc: Toolchain, u: Unit) -> Path:
    if u.obj.is_file():
        return u.obj
    u.obj.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp(u.obj)
    out = subprocess.run(
        [tc.cxx, *tc.flags, *tc.platform.openmp, *u.flags, "-c", str(u.src), "-o", str(tmp)],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise KernelBuildError(f"compiling {u.src.name} failed: {first_diagnostic(out.stderr)}")
    tmp.replace(u.obj)
    return u.obj


def compile_units(tc: Toolchain, units: list[Unit], workers: int) -> None:
    """Every unit not compiled yet, ``workers`` at a time, in the order given (longest first pays)."""
    with ThreadPoolExecutor(max(1, workers)) as pool:
        for f in [pool.submit(compile_unit, tc, u) for u in units]:
            f.result()


def link(tc: Toolchain, objs: list[Path], dest: Path) -> Path:
    """``objs`` linked into the shared library ``dest``; refused where one of the library's own
    functions is left undefined (a shared library links with undefined symbols, and would fail only
    at import, on the user's machine)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp(dest)
    cmd = [tc.cxx, "-shared", *map(str, objs), *tc.libs, *tc.platform.link, "-o", str(tmp)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise KernelBuildError(f"linking {dest.name} failed: {first_diagnostic(out.stderr)}")
    missing = undefined_own_symbols(tc, tmp)
    if missing:
        tmp.unlink(missing_ok=True)
        raise KernelBuildError(f"linking {dest.name}: {len(missing)} of its functions undefined, e.g. {missing[0]}")
    tmp.replace(dest)
    return dest


def undefined_own_symbols(tc: Toolchain, lib: Path) -> list[str]:
    """The library's undefined symbols in the opscope namespace (none where nm is missing)."""
    if tc.nm is None:
        return []
    out = subprocess.run([tc.nm, *tc.platform.nm_undefined, str(lib)], capture_output=True, text=True)
    return [line.split(None, 1)[-1] for line in out.stdout.splitlines() if "opscope::" in line]
