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
class Toolchain:
    """A compiler and what building against one torch takes: the flags of every unit (torch's
    headers), the link line's tail (torch's libraries), the tool that lists symbols."""

    cxx: str
    flags: tuple[str, ...]
    libs: tuple[str, ...]
    nm: str | None
    tag: str  # what the objects depend on besides the sources and flags (torch, target)


@dataclass(frozen=True)
class Unit:
    src: Path
    flags: tuple[str, ...]
    obj: Path


NO_COMPILER = (
    "no C++ compiler found (c++/g++): install one (e.g. `apt-get install g++`) "
    "to use the CPU fast path, or run with the dense torch path"
)


def host() -> Toolchain:
    """This machine's compiler, against the torch running this process."""
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        raise KernelBuildError(NO_COMPILER)
    import torch
    from torch.utils import cpp_extension

    flags = [f for inc in cpp_extension.include_paths() for f in ("-isystem", inc)]
    flags += common_flags()
    flags.append(f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}")
    lib = Path(torch.__file__).parent / "lib"
    libs = (f"-L{lib}", "-lc10", "-ltorch_cpu", "-ltorch")  # not torch_python: no Python in the library
    return Toolchain(cxx, tuple(flags), libs, shutil.which("nm"), torch.__version__)


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
        [tc.cxx, *tc.flags, *u.flags, "-c", str(u.src), "-o", str(tmp)], capture_output=True, text=True
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


def link(tc: Toolchain, objs: list[Path], ldflags: tuple[str, ...], dest: Path) -> Path:
    """``objs`` linked into the shared library ``dest``; refused where one of the library's own
    functions is left undefined (a shared library links with undefined symbols, and would fail only
    at import, on the user's machine)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp(dest)
    cmd = [tc.cxx, "-shared", *map(str, objs), *tc.libs, *ldflags, "-o", str(tmp)]
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
    out = subprocess.run([tc.nm, "-DC", "--undefined-only", str(lib)], capture_output=True, text=True)
    return [line.split(None, 1)[-1] for line in out.stdout.splitlines() if "opscope::" in line]
