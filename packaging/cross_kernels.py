"""Kernel libraries for a torch or an architecture this process does not run, so that the wheel
carries them: ARM64 (NEON) by cross-compiling, and x86-64 for another torch release.

    make prebuilt-arm      # = python packaging/cross_kernels.py [--out DIR]
    make prebuilt-torch    # = python packaging/cross_kernels.py --arch x86_64 --torch 2.14.1

``make dist`` then packs them beside the host's own variants: a user with that architecture and
that torch (under any Python) loads them without a compiler (engine.fastpath.kernels.
build's manifest lookup). A torch extension is tied to the torch it was compiled against, and pip
installs the newest torch into a new environment, so the wheel carries the pinned torch's kernels
(``opscope fastpath build --all``) and the newest release's too. torch's wheel for the target
(~430 MB for aarch64, ~550 MB for x86-64, from PyPI, kept in the per-user cache) gives the headers
and the libraries to link against; nothing of it is installed. The libraries are built from the same
sources and flags as ``opscope fastpath build`` on such a machine: one per variant of the
architecture. Cross-compiling for ARM64 needs Debian's ``g++-aarch64-linux-gnu``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from opscope.engine.fastpath.kernels import build, toolchain, variants
from opscope.engine.fastpath.kernels.toolchain import Toolchain


@dataclass(frozen=True)
class Target:
    """An architecture to build for: its compiler and binutils, pip's platform tag for torch's
    wheel, and the machine name readelf prints for its ELF files."""

    arch: str
    cxx: str
    readelf: str
    nm: str
    platform: str
    elf_machine: str


ARM64 = Target(
    "aarch64",
    "aarch64-linux-gnu-g++",
    "aarch64-linux-gnu-readelf",
    "aarch64-linux-gnu-nm",
    "manylinux_2_28_aarch64",
    "AArch64",
)
X86_64 = Target("x86_64", "g++", "readelf", "nm", "manylinux_2_28_x86_64", "X86-64")
TARGETS = {t.arch: t for t in (ARM64, X86_64)}
ARCH, CXX, READELF, NM, PLATFORM = ARM64.arch, ARM64.cxx, ARM64.readelf, ARM64.nm, ARM64.platform
# What the extension is compiled against and links with; the rest of the wheel is never unpacked.
_MEMBERS = ("torch/include/", "torch/lib/libc10.so", "torch/lib/libtorch.so", "torch/lib/libtorch_cpu.so")


class CrossError(RuntimeError):
    """A step of the cross build failed: the message says which and what to do."""


def torch_version() -> str:
    import torch

    return torch.__version__.split("+")[0]


def torch_wheel(cache: Path, version: str, target: Target = ARM64) -> Path:
    """torch's wheel for ``target`` and this CPython, downloaded once into ``cache``."""
    py = f"{sys.version_info.major}{sys.version_info.minor}"
    return download_wheel(cache, "torch", version, target.arch, (target.platform,), py)


def download_wheel(
    cache: Path, name: str, version: str, arch: str, platforms: tuple[str, ...], py: str, abi3: bool = False
) -> Path:
    """``name==version``'s wheel for CPython ``py`` (``"311"``) on ``arch``, one of pip's
    ``platforms`` tags, downloaded once into ``cache`` (which holds other Pythons' wheels too).
    ``abi3``: the wheel for CPython's stable ABI (one for every CPython 3, e.g. tokenizers')."""
    pattern = f"{name}-{version}-cp*-abi3-*{arch}.whl" if abi3 else f"{name}-{version}-cp{py}-*{arch}.whl"
    if not sorted(cache.glob(pattern)):
        pip_download([*download_cmd(cache, platforms, py), *(["--abi", "abi3"] if abi3 else []), f"{name}=={version}"])
    found = sorted(cache.glob(pattern))
    if not found:
        raise CrossError(f"downloading {name}=={version} for CPython {py} on {arch} failed: is PyPI reachable?")
    return found[0]


def download_cmd(cache: Path, platforms: tuple[str, ...], py: str) -> list[str]:
    """``pip download`` of binary wheels for CPython ``py`` on one of ``platforms`` into ``cache``,
    less the requirement."""
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", str(cache)]
    cmd += [f"--platform={p}" for p in platforms]
    return cmd + ["--python-version", py, "--implementation", "cp", "--abi", f"cp{py}"]


def pip_download(cmd: list[str]) -> bool:
    """Run ``pip download`` ``cmd``; where pip's configuration refuses the release (a machine whose
    pip.conf caps torch at what lies on its disk), once more without that configuration: a wheel
    unpacked for its headers installs nothing."""
    if subprocess.run(cmd, capture_output=True, text=True).returncode == 0:
        return True
    return subprocess.run(cmd, env={**os.environ, "PIP_CONFIG_FILE": os.devnull}).returncode == 0


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


def merge_wheel(wheel: Path, dest: Path) -> None:
    """The whole wheel unpacked beside what ``dest`` holds (through a temporary folder, so that a
    half-done extraction leaves none of its top-level names behind)."""
    tmp = unpack(wheel, dest / f"{wheel.name}.tmp")
    for part in tmp.iterdir():
        part.replace(dest / part.name)
    tmp.rmdir()


def torch_tree(cache: Path, version: str, target: Target = ARM64) -> Path:
    """torch's headers and the libraries the extension links with, from its wheel for ``target``."""
    wheel = torch_wheel(cache, version, target)
    return unpack(wheel, cache / f"torch{version}-{target.arch}-dev", _MEMBERS)


def folder_name(version: str, target: Target) -> str:
    """The prebuilt folder of ``target``'s libraries for torch ``version``'s minor release
    (build.abi_tag's form)."""
    return build.prebuilt_folder(version, target.arch)


def cross_toolchain(tree: Path, version: str, target: Target = ARM64) -> Toolchain:
    """``target``'s compiler against ``tree``'s torch, with torch's cpp_extension flags. torch's own
    libraries need CUDA (and on ARM64 ARM Compute) libraries that are not here: the link checks only
    this library's symbols (--allow-shlib-undefined); the loader resolves theirs where it runs."""
    inc = tree / "torch" / "include"
    flags = ("-isystem", str(inc), "-isystem", str(inc / "torch" / "csrc" / "api" / "include"))
    lib = tree / "torch" / "lib"
    libs = (f"-L{lib}", f"-Wl,-rpath-link,{lib}", "-Wl,--allow-shlib-undefined", "-lc10", "-ltorch_cpu", "-ltorch")
    tag = f"{target.arch} torch{version}"
    return Toolchain(target.cxx, (*flags, *toolchain.common_flags()), libs, shutil.which(target.nm), tag)


def compile_library(tc: Toolchain, name: str, v: variants.Variant, dest: Path, cache: Path, folder: str) -> None:
    """The variant's library, compiled and linked as build.compile_variants does on the host (the
    torch half compiled once for every variant of the target), with the target's compiler. The
    variant's objects go under ``folder`` (the target's and torch's): they include torch's headers."""
    try:
        built = build.compile_variants(tc, [(v, name, cache / "obj" / folder / name)], cache / "obj")[v.name]
    except build.KernelBuildError as e:
        raise CrossError(f"building {name} for {v.arch} failed: {e}") from e
    shutil.copyfile(built, dest)


def check_library(path: Path, name: str, target: Target = ARM64) -> list[str]:
    """What is wrong with ``path`` as ``target``'s extension module ``name`` (empty: nothing)."""
    # the host's GNU readelf reads any machine's ELF headers where the target's binutils are absent
    readelf = target.readelf if shutil.which(target.readelf) else "readelf"
    header = subprocess.run([readelf, "-h", str(path)], capture_output=True, text=True).stdout
    symbols = subprocess.run([readelf, "--dyn-syms", "-W", str(path)], capture_output=True, text=True).stdout
    machine = next((line.split(":", 1)[1].strip() for line in header.splitlines() if "Machine:" in line), "")
    problems = [] if machine == _MACHINE_TEXT[target.elf_machine] else [f"not an {target.elf_machine} ELF file"]
    if not any(line.split()[-1:] == [ENTRY] and " FUNC " in line for line in symbols.splitlines()):
        problems.append(f"exports no {ENTRY}() (entry.cpp: which library {name} is)")
    return problems


ENTRY = "opscope_kernel_library"  # the C function every library exports (entry.cpp)
# readelf -h's "Machine:" line for each target
_MACHINE_TEXT = {"AArch64": "AArch64", "X86-64": "Advanced Micro Devices X86-64"}


def _recorded(folder: Path) -> dict:
    try:
        return json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError):
        return {}


def cross_build(out_root: Path, cache: Path, v: variants.Variant, version: str | None = None) -> Path:
    """Variant ``v``'s library for torch ``version`` (default: this process's) in ``out_root``'s
    folder for that torch and ``v``'s architecture (kept when built from these sources)."""
    target = TARGETS[v.arch]
    for tool in (target.cxx, target.readelf, target.nm):
        if shutil.which(tool) is None:
            hint = "apt-get install g++-aarch64-linux-gnu" if target is ARM64 else "apt-get install g++ binutils"
            raise CrossError(f"{tool} not found: {hint}")
    version = version or torch_version()
    tree = torch_tree(cache, version, target)
    name = build.module_name(v)
    folder = out_root / folder_name(version, target)
    folder.mkdir(parents=True, exist_ok=True)
    dest = folder / f"{name}{build.SUFFIX}"
    if dest.is_file() and _recorded(folder).get(v.name, {}).get("sources") == build.sources_key(v):
        return dest  # built from these sources already
    tmp = folder / f".{dest.name}.tmp"
    compile_library(cross_toolchain(tree, version, target), name, v, tmp, cache, folder.name)
    problems = check_library(tmp, name, target)
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
    ap.add_argument("--cache", default=str(build.cache_root().parent / "cross"), help="torch's wheels and objects")
    ap.add_argument("--arch", choices=sorted(TARGETS), default=ARCH, help=f"default: {ARCH}")
    ap.add_argument("--torch", metavar="VERSION", help="the torch release to build for (default: this one's)")
    a = ap.parse_args(argv)
    version = a.torch or torch_version()
    if a.arch == variants.arch() and build.torch_series(version) == build.torch_series(torch_version()):
        print(f"cross_kernels: this torch on {a.arch}: `opscope fastpath build --all` builds those", file=sys.stderr)
        return 2
    try:
        for v in variants.for_arch(a.arch):
            print(f"{v.name}: {cross_build(Path(a.out), Path(a.cache), v, version)}")
    except CrossError as e:
        print(f"cross_kernels: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
