"""Cross-compile the ARM64 (NEON) CPU kernels for the pinned torch, so that the wheel carries them.

    make prebuilt-arm      # = python packaging/cross_kernels.py [--out DIR]

``make dist`` then packs them beside the x86-64 variants: an aarch64 Linux user with the same torch
and CPython minor version loads them without a compiler (engine.fastpath.kernels.build's manifest
lookup). Needs Debian's ``g++-aarch64-linux-gnu`` and PyPI: torch's aarch64 wheel (~430 MB, kept in
the per-user cache) gives the headers and the libraries to link against. The library is built from
the same sources and flags as ``opscope fastpath build`` on an ARM machine: one library per aarch64
variant (``neon-dotprod``, ``neon``).
"""

from __future__ import annotations

import argparse
import importlib.machinery
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from opscope.engine.fastpath.kernels import build, toolchain, variants
from opscope.engine.fastpath.kernels.toolchain import Toolchain

ARCH = "aarch64"
CXX = "aarch64-linux-gnu-g++"
READELF = "aarch64-linux-gnu-readelf"
NM = "aarch64-linux-gnu-nm"
PLATFORM = "manylinux_2_28_aarch64"
# What the extension is compiled against and links with; the rest of the wheel is never unpacked.
_MEMBERS = ("torch/include/", "torch/lib/libc10.so", "torch/lib/libtorch.so", "torch/lib/libtorch_cpu.so")
_MEMBERS += ("torch/lib/libtorch_python.so",)


class CrossError(RuntimeError):
    """A step of the cross build failed: the message says which and what to do."""


def torch_version() -> str:
    import torch

    return torch.__version__.split("+")[0]


def torch_wheel(cache: Path, version: str) -> Path:
    """torch's aarch64 wheel for this CPython (~430 MB), downloaded once into ``cache``."""
    py = f"{sys.version_info.major}{sys.version_info.minor}"
    pattern = f"torch-{version}-cp{py}-cp{py}-*{ARCH}.whl"
    found = sorted(cache.glob(pattern))
    if found:
        return found[0]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--platform", PLATFORM]
    cmd += ["--python-version", py, "--implementation", "cp", "--abi", f"cp{py}", f"torch=={version}", "-d", str(cache)]
    if subprocess.run(cmd).returncode != 0 or not sorted(cache.glob(pattern)):
        raise CrossError(f"downloading torch=={version} for {PLATFORM} failed: is PyPI reachable?")
    return sorted(cache.glob(pattern))[0]


def unpack(wheel: Path, dest: Path, members: tuple[str, ...] = ("",)) -> Path:
    """The wheel's files whose names start with one of ``members``, extracted into ``dest`` once."""
    if dest.is_dir():
        return dest
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with zipfile.ZipFile(wheel) as z:
        z.extractall(tmp, [n for n in z.namelist() if n.startswith(members)])
    tmp.replace(dest)
    return dest


def torch_tree(cache: Path, version: str) -> Path:
    """torch's headers and the libraries the extension links with, from its aarch64 wheel."""
    wheel = torch_wheel(cache, version)
    return unpack(wheel, cache / f"torch{version}-{sys.implementation.cache_tag}-{ARCH}-dev", _MEMBERS)


def cross_toolchain(tree: Path, version: str) -> Toolchain:
    """The cross compiler against ``tree``'s torch, with torch's cpp_extension flags. torch's own
    libraries need CUDA and ARM Compute libraries that are not here: the link checks only this
    library's symbols (--allow-shlib-undefined); the loader resolves theirs on the ARM host."""
    inc = tree / "torch" / "include"
    pyinc = Path(sys.base_prefix) / "include" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    flags = ("-isystem", str(inc), "-isystem", str(inc / "torch" / "csrc" / "api" / "include"), "-isystem", str(pyinc))
    lib = tree / "torch" / "lib"
    libs = (f"-L{lib}", f"-Wl,-rpath-link,{lib}", "-Wl,--allow-shlib-undefined", "-lc10", "-ltorch_cpu", "-ltorch")
    tag = f"{ARCH} torch{version} {sys.version}"
    return Toolchain(CXX, (*flags, *toolchain.common_flags()), (*libs, "-ltorch_python"), shutil.which(NM), tag)


def compile_library(tc: Toolchain, name: str, v: variants.Variant, dest: Path, cache: Path) -> None:
    """The variant's library, compiled and linked as build.compile_variants does on the host (the
    torch half compiled once for both aarch64 variants), with the cross compiler."""
    try:
        built = build.compile_variants(tc, [(v, name, cache / "obj" / name)], cache / "obj")[v.name]
    except build.KernelBuildError as e:
        raise CrossError(f"building {name} for {ARCH} failed: {e}") from e
    shutil.copyfile(built, dest)


def check_library(path: Path, name: str) -> list[str]:
    """What is wrong with ``path`` as the aarch64 extension module ``name`` (empty: nothing)."""
    header = subprocess.run([READELF, "-h", str(path)], capture_output=True, text=True).stdout
    symbols = subprocess.run([READELF, "--dyn-syms", "-W", str(path)], capture_output=True, text=True).stdout
    problems = [] if "AArch64" in header else ["not an AArch64 ELF file"]
    if not any(line.split()[-1:] == [f"PyInit_{name}"] and " FUNC " in line for line in symbols.splitlines()):
        problems.append(f"exports no PyInit_{name}")
    return problems


def _recorded(folder: Path) -> dict:
    try:
        return json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError):
        return {}


def cross_build(out_root: Path, cache: Path, v: variants.Variant) -> Path:
    """Variant ``v``'s library in ``out_root``'s aarch64 folder (kept when built from these sources)."""
    for tool in (CXX, READELF, NM):
        if shutil.which(tool) is None:
            raise CrossError(f"{tool} not found: apt-get install g++-aarch64-linux-gnu")
    version = torch_version()
    tree = torch_tree(cache, version)
    name = build.module_name(v)
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0].replace(variants.arch(), ARCH)
    folder = out_root / f"torch{version}-{sys.implementation.cache_tag}-{ARCH}"
    folder.mkdir(parents=True, exist_ok=True)
    dest = folder / f"{name}{suffix}"
    if dest.is_file() and _recorded(folder).get(v.name, {}).get("sources") == build.sources_key(v):
        return dest  # built from these sources already
    tmp = folder / f".{dest.name}.tmp"
    compile_library(cross_toolchain(tree, version), name, v, tmp, cache)
    problems = check_library(tmp, name)
    if problems:
        raise CrossError(f"{tmp}: {'; '.join(problems)}")
    prefix = name.rsplit("_", 1)[0] + "_"
    for stale in folder.glob(f"{prefix}*"):  # this variant built from older sources (not neon vs neon_dotprod)
        key = stale.name[len(prefix) :].split(".", 1)[0]
        if len(key) == 16 and "_" not in key:
            stale.unlink()
    tmp.replace(dest)
    build.record_prebuilt(v, dest)
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(build.prebuilt_root()), help="default: the package's prebuilt/")
    ap.add_argument("--cache", default=str(build.cache_root().parent / "cross"), help="torch's aarch64 files")
    a = ap.parse_args(argv)
    try:
        for v in variants.for_arch(ARCH):
            print(f"{v.name}: {cross_build(Path(a.out), Path(a.cache), v)}")
    except CrossError as e:
        print(f"cross_kernels: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
