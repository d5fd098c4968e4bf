"""packaging/cross_kernels.py for another torch on this architecture (`make prebuilt-torch`), and the
stubs `make python-check` starts that torch with: the folder it writes is the one the loader reads
for that torch, its library check, the one line it prints where asked for what `opscope fastpath
build --all` builds, and an x86-64 stub's answers. The whole build and its runs are `make
newest-torch-check` (a new venv with that torch, tests/test_packaging.py; ~5 GB) and `make
python-check` (Debian 13's CPython 3.13)."""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from opscope.engine.fastpath.kernels import build, variants

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "packaging"))

import cross_kernels  # noqa: E402


def test_the_folder_for_a_torch_is_the_one_the_loader_reads_under_that_torch():
    import torch

    target = cross_kernels.TARGETS[variants.arch()]
    assert cross_kernels.folder_name(torch.__version__.split("+")[0], target) == build.abi_tag()
    # one folder per minor release: its patch releases keep torch's C++ ABI
    assert cross_kernels.folder_name("2.14.1", target) == cross_kernels.folder_name("2.14.0+cu130", target)
    assert cross_kernels.folder_name("2.14.1", target) == f"torch2.14-{variants.arch()}"
    assert build.abi_tag() == f"torch{build.torch_series(torch.__version__)}-{variants.arch()}"


def test_an_apple_silicon_mac_reads_its_own_folder_not_linuxs_aarch64_one():
    # the same torch release and architecture: a Linux ELF library must not be a Mac's prebuilt one
    assert build.prebuilt_folder("2.14.1", "aarch64", "linux") == "torch2.14-aarch64"
    assert build.prebuilt_folder("2.14.1", "aarch64", "darwin") == "torch2.14-aarch64-macos"


@pytest.mark.skipif(platform.machine() != "x86_64" or shutil.which("gcc") is None, reason="needs an x86-64 gcc")
def test_the_x86_64_library_check_names_what_is_wrong(tmp_path):
    def library(name: str, source: str) -> Path:
        (tmp_path / f"{name}.c").write_text(source)
        subprocess.run(["gcc", "-shared", "-fPIC", str(tmp_path / f"{name}.c"), "-o", str(tmp_path / name)], check=True)
        return tmp_path / name

    x86 = cross_kernels.X86_64
    lib = library("ext.so", 'const char *opscope_kernel_library(void) { return "x"; }\n')
    assert cross_kernels.check_library(lib, "opscope_qlinear_avx2_0", x86) == []
    other = library("other.so", "int opscope_other(void) { return 0; }\n")
    assert cross_kernels.check_library(other, "opscope_qlinear_avx2_1", x86) == [
        "exports no opscope_kernel_library() (entry.cpp: which library opscope_qlinear_avx2_1 is)"
    ]
    assert "not an AArch64 ELF file" in cross_kernels.check_library(lib, "opscope_qlinear_avx2_0")


def test_asking_for_this_torch_on_this_architecture_is_one_line_and_exit_2():
    import torch

    version = torch.__version__.split("+")[0]
    r = subprocess.run(
        [sys.executable, str(ROOT / "packaging" / "cross_kernels.py"), "--arch", variants.arch(), "--torch", version],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr == f"cross_kernels: this torch on {variants.arch()}: `opscope fastpath build --all` builds those\n"


@pytest.mark.skipif(platform.machine() != "x86_64" or shutil.which("gcc") is None, reason="needs an x86-64 gcc")
def test_x86_64_stub_functions_return_no_device_and_objects_are_zeroed(tmp_path):
    """`make python-check` starts torch's CUDA build with stubs for the NVIDIA libraries it names
    (packaging/arm_check.stubs, here for x86-64): a stub function answers 100 (cudaErrorNoDevice)."""
    import ctypes

    import arm_check

    src, lib = tmp_path / "stub.S", tmp_path / "libstub.so"
    src.write_text(arm_check._stub_source([("cudaGetDeviceCount", "FUNC"), ("someTable", "OBJECT")], "x86_64"))
    subprocess.run(["gcc", "-shared", "-fPIC", "-nostdlib", str(src), "-o", str(lib)], check=True)
    stub = ctypes.CDLL(str(lib))
    assert stub.cudaGetDeviceCount() == 100
    assert bytes((ctypes.c_char * 256).in_dll(stub, "someTable")) == bytes(256)
