"""The ARM64 cross build's pieces (packaging/cross_kernels.py, packaging/arm_check.py) on real files
made with Debian's aarch64 toolchain: the library check that gates what goes into the wheel, and
the stub libraries that let PyPI's CUDA-built aarch64 torch start under qemu-user. The whole cross
build and its run inside aarch64 torch are `make prebuilt-arm arm-check` (minutes, ~430 MB from
PyPI): not part of `make test`."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "packaging"))

import arm_check  # noqa: E402
import cross_kernels  # noqa: E402

CC = "aarch64-linux-gnu-gcc"
pytestmark = pytest.mark.skipif(
    shutil.which(CC) is None or shutil.which(cross_kernels.READELF) is None,
    reason="no aarch64 cross toolchain: apt-get install g++-aarch64-linux-gnu",
)


def aarch64_library(tmp_path: Path, name: str, source: str, *flags: str) -> Path:
    src, out = tmp_path / f"{name}.c", tmp_path / name
    src.write_text(source)
    subprocess.run([CC, "-shared", "-fPIC", str(src), "-o", str(out), *flags], check=True)
    return out


def test_library_check_accepts_an_aarch64_extension_and_names_what_is_wrong(tmp_path):
    lib = aarch64_library(tmp_path, "ext.so", 'const char *opscope_kernel_library(void) { return "n"; }\n')
    assert cross_kernels.check_library(lib, "opscope_qlinear_neon_0") == []
    other = aarch64_library(tmp_path, "other.so", "int opscope_other(void) { return 0; }\n")
    assert cross_kernels.check_library(other, "opscope_qlinear_neon_1") == [
        "exports no opscope_kernel_library() (entry.cpp: which library opscope_qlinear_neon_1 is)"
    ]
    host = Path(sys.executable).resolve()  # an x86-64 (or whatever this host is) ELF file
    if "AArch64" not in subprocess.run([cross_kernels.READELF, "-h", str(host)], capture_output=True, text=True).stdout:
        assert "not an AArch64 ELF file" in cross_kernels.check_library(host, "x")


def test_stubs_carry_the_sonames_symbol_versions_and_symbols_torch_asks_for(tmp_path):
    """A library that needs `libfake.so.13` and its function `fake_call` at version `libfake.so.13`
    (as libtorch_cpu.so needs libcudart.so.13): the stub made for it has that soname, defines that
    version, and defines the function at it (CPython loads extensions with RTLD_NOW)."""
    real = aarch64_library(
        tmp_path,
        "libfake.so.13",
        "int fake_call(void) { return 1; }\n",
        "-Wl,-soname,libfake.so.13",
        f"-Wl,--version-script,{_map(tmp_path, 'libfake.so.13 { global: fake_call; local: *; };')}",
    )
    site = tmp_path / "site"
    (site / "torch" / "lib").mkdir(parents=True)
    user = aarch64_library(
        site / "torch" / "lib",
        "libuser.so",
        "int fake_call(void); int use(void) { return fake_call(); }\n",
        f"-L{tmp_path}",
        "-l:libfake.so.13",
    )
    assert user.is_file() and real.is_file()
    root = tmp_path / "sysroot"
    (root / "lib" / "aarch64-linux-gnu").mkdir(parents=True)
    stub_dir = arm_check.stubs(site, root, tmp_path)
    stub = stub_dir / "libfake.so.13"
    dyn = subprocess.run([cross_kernels.READELF, "-d", "-V", "-W", str(stub)], capture_output=True, text=True).stdout
    assert "Library soname: [libfake.so.13]" in dyn
    assert "Name: libfake.so.13" in dyn  # the version definition the loader checks for
    syms = subprocess.run([cross_kernels.READELF, "--dyn-syms", "-W", str(stub)], capture_output=True, text=True).stdout
    assert any(
        line.split()[3:4] == ["FUNC"] and line.split()[-1] == "fake_call@@libfake.so.13" for line in syms.splitlines()
    )
    # made once for the same libraries; made again when one changes
    made = stub.stat().st_mtime_ns
    assert arm_check.stubs(site, root, tmp_path) == stub_dir and stub.stat().st_mtime_ns == made
    with user.open("ab") as f:
        f.write(b"\0" * 16)
    arm_check.stubs(site, root, tmp_path)
    assert stub.stat().st_mtime_ns != made


def _map(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fake.map"
    path.write_text(text + "\n")
    return path
