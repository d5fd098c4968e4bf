"""The prebuilt kernel libraries under another CPython: Debian 13's 3.13, with nothing compiled.

    make python-check      # = python packaging/python_check.py [--torch VERSION]

Each library is a plain shared library over torch's C++ libraries, with no Python in it, so one
build serves every CPython that runs its torch. This runs Debian 13's CPython 3.13 (its .debs
unpacked into a sysroot with their own glibc, started through their own ld-linux), torch's cp313
wheel for ``--torch`` (default: the Makefile's newest, whose libraries `make prebuilt-torch` builds
under this Python), numpy's, stub libraries for the NVIDIA ones torch's CUDA build names
(arm_check.stubs), this checkout as ``opscope``, an empty kernel cache and no compiler on PATH. For
every x86-64 variant this CPU runs, packaging/arm_guest.py loads the library through the engine's
own loader, which must take it from ``prebuilt/``, and checks every type's ops against the references
made here. x86-64 Linux only; downloads ~600 MB once (kept in the per-user cache).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import arm_check
import cross_kernels as cross
from opscope.engine.fastpath.kernels import build, variants

HERE = Path(__file__).resolve().parent
PY = "3.13"
# Debian 13's CPython and what its interpreter, its standard library and torch link with.
DEBS = (
    "p/python3.13/python3.13-minimal_3.13.5-2+deb13u5_amd64.deb",
    "p/python3.13/libpython3.13-minimal_3.13.5-2+deb13u5_amd64.deb",
    "p/python3.13/libpython3.13-stdlib_3.13.5-2+deb13u5_amd64.deb",
    "g/glibc/libc6_2.41-12+deb13u5_amd64.deb",
    "libf/libffi/libffi8_3.4.8-2_amd64.deb",
    "z/zlib/zlib1g_1.3.dfsg+really1.3.1-1+deb13u1_amd64.deb",
    "e/expat/libexpat1_2.9.0-1~deb13u1_amd64.deb",
    "b/bzip2/libbz2-1.0_1.0.8-6_amd64.deb",
    "x/xz-utils/liblzma5_5.8.1-1+deb13u2_amd64.deb",
    "u/util-linux/libuuid1_2.41.5-0+deb13u1_amd64.deb",
    "libx/libxcrypt/libcrypt1_4.4.38-1_amd64.deb",
    "m/mpdecimal/libmpdec4_4.0.1-5_amd64.deb",
    "libz/libzstd/libzstd1_1.5.7+dfsg-1_amd64.deb",
    "g/gcc-14/libgcc-s1_14.2.0-19_amd64.deb",
    "g/gcc-14/libstdc++6_14.2.0-19_amd64.deb",
)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def newest_torch() -> str:
    makefile = (HERE.parent / "Makefile").read_text()
    return re.search(r"^NEWEST_TORCH := (\S+)$", makefile, re.M)[1]  # type: ignore[index]


def sysroot(cache: Path) -> Path:
    """Debian 13's CPython 3.13 and its C libraries, unpacked once into ``cache``."""
    root = cache / "sysroot-debian13-x86_64"
    if (root / "usr" / "bin" / f"python{PY}").is_file():
        return root
    tmp = cache / "sysroot-debian13-x86_64.tmp"
    arm_check.unpack_debs(DEBS, cache / "debs", tmp)
    tmp.replace(root)
    return root


def site(cache: Path, version: str) -> Path:
    """torch's and numpy's cp313 wheels unpacked, the pure-Python dependencies beside them, and
    this checkout as the package ``opscope``."""
    import numpy

    dest = cache / f"site-torch{version}-cp313-x86_64"
    if not (dest / "torch").is_dir():
        tmp = dest.with_name(dest.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for name, release in (("torch", version), ("numpy", numpy.__version__)):
            cross.merge_wheel(cross.download_wheel(cache, name, release, "x86_64", PLATFORMS, PY.replace(".", "")), tmp)
        tmp.replace(dest)
    arm_check.copy_pure(dest)
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", default=str(build.cache_root().parent / "cross"), help="downloads and sysroot")
    ap.add_argument("--torch", metavar="VERSION", help="default: the Makefile's NEWEST_TORCH")
    a = ap.parse_args(argv)
    cache, version = Path(a.cache), a.torch or newest_torch()
    try:
        if variants.arch() != "x86_64":
            raise cross.CrossError(f"x86-64 Linux only (this is {variants.arch()})")
        folder = build.prebuilt_root() / cross.folder_name(version, cross.X86_64)
        if not (folder / "manifest.json").is_file():
            raise cross.CrossError(f"no kernel libraries for torch {version} in {folder}: run `make prebuilt-torch`")
        root = sysroot(cache)
        site_dir = site(cache, version)
        stub_dir = arm_check.stubs(site_dir, root, cache, "x86_64", f"python{PY}")
        inputs = cache / "arm_check_inputs.pt"
        arm_check.make_inputs(inputs)
    except (cross.CrossError, subprocess.CalledProcessError) as e:
        print(f"python_check: {e}", file=sys.stderr)
        return 2
    libs = [str(stub_dir), str(root / "usr" / "lib" / "x86_64-linux-gnu"), str(root / "lib" / "x86_64-linux-gnu")]
    loader = root / "usr" / "lib" / "x86_64-linux-gnu" / "ld-linux-x86-64.so.2"
    empty = cache / "empty-path"
    empty.mkdir(exist_ok=True)
    failed = []
    for v in variants.runnable():
        env = {
            "HOME": os.environ.get("HOME", "/"),
            "PATH": str(empty),  # no compiler: the library can only come from prebuilt/
            "PYTHONPATH": str(site_dir),
            "OPSCOPE_KERNEL_CACHE": str(cache / "empty-kernel-cache"),
            variants.ENV: v.name,
        }
        cmd = [str(loader), "--library-path", ":".join(libs), str(root / "usr" / "bin" / f"python{PY}")]
        print(f"variant {v.name}", flush=True)
        if subprocess.run([*cmd, str(HERE / "arm_guest.py"), str(inputs), v.name], env=env).returncode != 0:
            failed.append(v.name)
    if failed:
        print(f"python_check: {', '.join(failed)} failed", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
