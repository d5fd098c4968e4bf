"""The kernel library's first-use build for Apple Silicon, done here: every aarch64 variant compiled
and linked as a Mac would build it (toolchain.against_torch for "darwin": OpenMP through clang's
front end, torch's @rpath libraries, -undefined dynamic_lookup) against torch's macOS wheel, with
clang targeting arm64 macOS (zig's, from PyPI: it carries macOS's C and C++ headers), then read
back as Mach-O files.

    make macos-check      # = python packaging/macos_check.py [--torch VERSION]

No prebuilt library for macOS comes of it: a Mac compiles its kernels at first use (with Apple's
clang and libc++; zig links its own libc++), and nothing here runs Mach-O code. What it shows is
that the sources and flags a Mac uses compile and link for macOS, that each library exports its
entry point and leaves none of its own functions undefined, and that it names torch's libraries
by @rpath (not a path on torch's build machine, as libomp's own install name is).
"""

from __future__ import annotations

import argparse
import os
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cross_kernels import CrossError, download_cmd, download_wheel, unpack
from opscope.engine.fastpath.kernels import build, toolchain, variants

ZIG = "ziglang==0.17.1"
PLATFORMS = tuple(f"macosx_{v}_0_arm64" for v in (11, 12, 13, 14, 15))
_MEMBERS = ("torch/include/", "torch/lib/libc10.dylib", "torch/lib/libtorch.dylib", "torch/lib/libtorch_cpu.dylib")
MH_MAGIC_64, CPU_TYPE_ARM64 = 0xFEEDFACF, 0x0100000C
ENTRY = "_opscope_kernel_library"  # entry.cpp's C function, with Mach-O's leading underscore
# zig's driver reads -march as a CPU's name; clang's -march=<arch>+<ext> becomes -mcpu=generic+...
_MARCH = {
    "-march=armv8-a": "-mcpu=generic",
    "-march=armv8.2-a+dotprod": "-mcpu=generic+v8_2a+dotprod",
    "-march=armv8.2-a+dotprod+i8mm": "-mcpu=generic+v8_2a+dotprod+i8mm",
}


def zig_python(cache: Path) -> Path:
    """A Python with zig's compiler (``python -m ziglang``), installed once into ``cache``."""
    py = cache / "zig-venv" / "bin" / "python"
    if not py.is_file():
        subprocess.run([sys.executable, "-m", "venv", str(py.parent.parent)], check=True)
        if subprocess.run([str(py), "-m", "pip", "install", "-q", ZIG]).returncode != 0:
            raise CrossError(f"installing {ZIG} failed: is PyPI reachable?")
    return py


def compiler(cache: Path) -> Path:
    """A c++ that is zig's clang for arm64 macOS, with clang's -march spelled as zig reads it."""
    wrapper = cache / "zig-macos-c++"
    marches = " ".join(f'"{k}") a="{v}" ;;' for k, v in _MARCH.items())
    wrapper.write_text(
        "#!/bin/sh\n"
        "# zig's clang for arm64 macOS (packaging/macos_check.py)\n"
        'for a in "$@"; do shift; case "$a" in ' + marches + ' esac; set -- "$@" "$a"; done\n'
        f'exec "{zig_python(cache)}" -m ziglang c++ -target aarch64-macos "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper


def torch_macos(cache: Path, version: str | None) -> tuple[str, Path]:
    """(version, tree) of torch's macOS arm64 wheel for this CPython (the newest on PyPI where
    ``version`` is None): its headers and the libraries the library links with."""
    py = f"{sys.version_info.major}{sys.version_info.minor}"
    wheels = cache / "macos-wheels"
    if version:
        wheel = download_wheel(wheels, "torch", version, "arm64", PLATFORMS, py)
    else:  # the newest, as a Mac's pip sees PyPI (not this machine's pip.conf, which caps torch)
        cmd = [*download_cmd(wheels, PLATFORMS, py), "torch"]
        subprocess.run(cmd, env={**os.environ, "PIP_CONFIG_FILE": os.devnull})
        found = sorted(wheels.glob(f"torch-*-cp{py}-*arm64.whl"), key=lambda p: _release(p.name.split("-")[1]))
        if not found:
            raise CrossError(f"downloading torch's macOS arm64 wheel for CPython {py} failed: is PyPI reachable?")
        wheel = found[-1]
    got = wheel.name.split("-")[1]
    return got, unpack(wheel, cache / f"torch{got}-aarch64-macos-dev", _MEMBERS)


def _release(version: str) -> list[int]:
    return [int(x) for x in version.split("+")[0].split(".")[:3]]


def macos_toolchain(cache: Path, tree: Path, version: str) -> toolchain.Toolchain:
    inc = tree / "torch" / "include"
    nm = shutil.which("llvm-nm")
    if nm is None:
        raise CrossError("llvm-nm not found (it reads Mach-O files): apt-get install llvm")
    include = [inc, inc / "torch" / "csrc" / "api" / "include"]
    lib = tree / "torch" / "lib"
    tag = f"aarch64-macos torch{version}"
    return toolchain.against_torch(str(compiler(cache)), include, lib, "darwin", nm, tag, cxx11_abi=False)


def mach_o_problems(path: Path, tc: toolchain.Toolchain) -> list[str]:
    """What is wrong with ``path`` as an arm64 macOS library of ours (empty: nothing)."""
    magic, cputype = struct.unpack("<II", path.read_bytes()[:8])
    problems = [] if (magic, cputype) == (MH_MAGIC_64, CPU_TYPE_ARM64) else ["not an arm64 Mach-O file"]
    exported = subprocess.run([str(tc.nm), "-g", "--defined-only", str(path)], capture_output=True, text=True).stdout
    if not any(line.split()[-1:] == [ENTRY] for line in exported.splitlines()):
        problems.append(f"exports no {ENTRY[1:]}()")
    for dylib in dylibs(path):
        if not dylib.startswith(("@rpath/", "/usr/lib/", "/System/")):
            problems.append(f"needs {dylib}, a path that a Mac does not have")
    return problems


def dylibs(path: Path) -> list[str]:
    """The libraries ``path`` loads (its LC_LOAD_DYLIB commands), by llvm-objdump: what it lists
    less the library's own install name (LC_ID_DYLIB, listed first)."""
    out = subprocess.run(["llvm-objdump", "--macho", "--dylibs-used", str(path)], capture_output=True, text=True)
    listed = [line.split(" (")[0].strip() for line in out.stdout.splitlines()[1:] if line.startswith("\t")]
    own = subprocess.run(["llvm-objdump", "--macho", "--dylib-id", str(path)], capture_output=True, text=True)
    ids = {line.strip() for line in own.stdout.splitlines()[1:]}
    return [d for d in listed if d not in ids]


def check(cache: Path, version: str | None) -> list[str]:
    """One line per aarch64 variant: built, what it loads; CrossError where one fails."""
    got, tree = torch_macos(cache, version)
    tc = macos_toolchain(cache, tree, got)
    lines = [f"torch {got} (macOS arm64 wheel), {tc.platform.name}: openmp {' '.join(tc.platform.openmp) or 'none'}"]
    with tempfile.TemporaryDirectory(prefix="opscope-macos-") as tmp:
        todo = [(v, build.module_name(v), Path(tmp) / v.name) for v in variants.for_arch("aarch64")]
        try:
            built = build.compile_variants(tc, todo, cache / "macos-obj")
        except toolchain.KernelBuildError as e:
            raise CrossError(f"building for macOS failed: {e}") from e
        for v, _, _ in todo:
            problems = mach_o_problems(built[v.name], tc)
            if problems:
                raise CrossError(f"{v.name}: {'; '.join(problems)}")
            size = built[v.name].stat().st_size >> 10
            lines.append(f"{v.name}: arm64 Mach-O, {size} KiB, loads {', '.join(dylibs(built[v.name]))}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", default=str(build.cache_root().parent / "cross"), help="wheels, zig, objects")
    ap.add_argument("--torch", metavar="VERSION", help="torch's macOS release (default: the newest on PyPI)")
    a = ap.parse_args(argv)
    cache = Path(a.cache)
    cache.mkdir(parents=True, exist_ok=True)
    try:
        for line in check(cache, a.torch):
            print(line)
    except CrossError as e:
        print(f"macos_check: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
