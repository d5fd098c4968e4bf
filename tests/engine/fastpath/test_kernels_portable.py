"""The portable kernels (engine/fastpath/kernels/csrc/portable.h over vec.h's traits) built without torch by
a small C++ driver (engine/fastpath/kernels/ctest/driver.cpp) for each instruction set: the x86-64 baseline
and AVX2 with the host's compiler, ARM64 NEON cross-compiled with Debian's aarch64 toolchain and
run under qemu-user. The references are made here: gguf.quants.dequantize and float64 numpy."""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path

import gguf
import numpy as np
import pytest
from opscope.engine.fastpath.kernels import variants
from opscope.engine.fastpath.kernels.packing import RAW_TYPES, random_blocks
from opscope.engine.testing import q8

ROOT = Path(__file__).resolve().parents[3]
DRIVER = ROOT / "engine" / "fastpath" / "kernels" / "ctest" / "driver.cpp"
TYPES = [
    "F16",
    "BF16",
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "Q8_0",
    "Q2_K",
    "Q3_K",
    "Q4_K",
    "Q5_K",
    "Q6_K",
    "IQ4_NL",
    "IQ4_XS",
]
N_ROWS = 14  # 4-row groups and two single rows; 3-row groups and a pair (Q4_K on AVX2)
# the types the int8-activation kernels (int8.h: AVX2, NEON) take as raw blocks; the others run float32
INT8_TYPES = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS"}


def write_vectors(path: Path) -> None:
    with open(path, "wb") as f:
        for i, t in enumerate(TYPES):
            qk = RAW_TYPES[t][1]
            k = 256 * 3 if qk == 256 else 32 * 5  # whole int8 activation blocks (F16/BF16 blocks are 16)
            rng = np.random.default_rng(100 + i)
            raw = random_blocks(t, N_ROWS, k, rng)
            dense = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[t]).reshape(N_ROWS, k).astype(np.float64)
            x = rng.standard_normal(k).astype(np.float32)
            raw = np.ascontiguousarray(raw).reshape(N_ROWS, -1)
            f.write(struct.pack("<4q", RAW_TYPES[t][0], N_ROWS, k, raw.shape[1]))
            f.write(raw.tobytes())
            f.write(x.tobytes())
            f.write((dense @ x.astype(np.float64)).tobytes())
            f.write((np.abs(dense) @ np.abs(x.astype(np.float64))).tobytes())
            qb = 256 if qk == 256 else 32  # the int8 activations' block (F16/BF16 take 32)
            q, scale = q8.quantize(x, qb)
            per32 = q.reshape(-1, 32).astype(np.int32).sum(-1)
            f.write(struct.pack("<q", qb))
            f.write(q.tobytes() + scale.tobytes())
            f.write(
                (np.repeat(scale, len(per32) // len(scale)) * per32.astype(np.float32)).astype(np.float32).tobytes()
            )
            f.write(q.reshape(-1, 16).astype(np.int32).sum(-1).astype(np.int16).tobytes())
            xq = q8.dequantized(x, qb)
            f.write((dense @ xq).tobytes())


def check(out: subprocess.CompletedProcess, vec_name: str, int8: bool) -> None:
    """Every type ran within tolerance (the driver's exit status), and the int8 kernels ran for
    INT8_TYPES exactly where the build has them."""
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == f"vec {vec_name}", lines[0]
    assert len(lines) == 2 + len(TYPES), out.stdout  # every type ran, and the helpers
    ran8 = {t for t, line in zip(TYPES, lines[1:]) if line.split(" q8 ")[1] != "-"}
    assert ran8 == (INT8_TYPES if int8 else set()), out.stdout


@pytest.fixture(scope="module")
def vectors(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("vectors") / "vectors.bin"
    write_vectors(path)
    return path


def _compile(cxx: str, flags: list[str], exe: Path) -> None:
    r = subprocess.run(
        [cxx, "-O2", "-std=c++17", *flags, "-o", str(exe), str(DRIVER)], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.mark.parametrize(
    "name, vec_name, int8",
    [
        ("baseline", "scalar", False),
        ("avx2", "avx2 int8 vpmaddubsw", True),
        ("avx2-vnni", "avx2 int8 vpdpbusd", True),
        ("avx512", "avx512", False),  # the bodies over VecAVX512 (the library's matvecs there: hand-written)
    ],
)
def test_x86_portable_kernels_match_the_references(vectors, tmp_path, name, vec_name, int8):
    """Each x86 build of the driver, compiled wherever a compiler is (the flags must build), run
    where the CPU can execute it."""
    v = variants.by_name(name)
    if variants.arch() != "x86_64":
        pytest.skip(f"{name} is an x86-64 variant")
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler (g++/c++) to build the test driver")
    _compile(cxx, list(v.cflags), tmp_path / "driver")
    if variants.missing(v):
        pytest.skip(f"{name} compiled; this CPU cannot run it: lacks {' '.join(variants.missing(v))}")
    check(
        subprocess.run([str(tmp_path / "driver"), str(vectors)], capture_output=True, text=True, timeout=120),
        vec_name,
        int8,
    )


# avx2-vnni's bodies through their AVX512-VNNI twin (OPSCOPE_VNNI_EVEX_TWIN: built without -mavxvnni,
# its one vpdpbusd in the EVEX encoding), for the matvec driver and the GEMM driver below
TWIN_FLAGS = tuple(f for f in variants.by_name("avx2-vnni").cflags if f != "-mavxvnni") + ("-DOPSCOPE_VNNI_EVEX_TWIN",)
TWIN_NEEDS = frozenset({"avx2", "fma", "f16c", "avx512_vnni", "avx512vl"})


def test_avx2_vnni_bodies_run_through_their_avx512_vnni_twin(vectors, tmp_path):
    """avx2-vnni's kernels differ from avx2's in one instruction, AVX-VNNI's vpdpbusd. Built with
    OPSCOPE_VNNI_EVEX_TWIN (and without -mavxvnni), that instruction is its AVX512-VNNI encoding, the
    same operation on 256 bits: a CPU with AVX512-VNNI but not AVX-VNNI (no emulator here has
    AVX-VNNI) runs the variant's bodies, its int8 dot products included."""
    if variants.arch() != "x86_64":
        pytest.skip("avx2-vnni is an x86-64 variant")
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler (g++/c++) to build the test driver")
    lacks = sorted(TWIN_NEEDS - variants.cpu_flags())
    if lacks:
        pytest.skip(f"the twin needs AVX2 and AVX512-VNNI/VL; this CPU lacks {' '.join(lacks)}")
    assert len(TWIN_FLAGS) == len(variants.by_name("avx2-vnni").cflags)  # -mavxvnni out, the twin's define in
    _compile(cxx, list(TWIN_FLAGS), tmp_path / "driver")
    run = subprocess.run([str(tmp_path / "driver"), str(vectors)], capture_output=True, text=True, timeout=120)
    check(run, "avx2 int8 vpdpbusd", True)


@pytest.mark.parametrize(
    "name, vec_name", [("neon", "neon int8 smull"), ("neon-dotprod", "neon int8 sdot"), ("neon-i8mm", "neon int8 sdot")]
)
def test_neon_kernels_match_the_references_under_qemu(vectors, tmp_path, name, vec_name):
    """Each aarch64 variant's flags: int8 products by widening multiplies (ARMv8.0) and by sdot (the
    i8mm variant's matvecs are sdot's too: its smmla is the prefill GEMM's, below)."""
    cxx, qemu = shutil.which("aarch64-linux-gnu-g++"), shutil.which("qemu-aarch64")
    if variants.arch() == "aarch64":
        cxx, qemu = shutil.which("g++") or shutil.which("c++"), None  # natively
        if variants.missing(variants.by_name(name)):
            pytest.skip(f"this CPU cannot run {name}: lacks {' '.join(variants.missing(variants.by_name(name)))}")
    elif cxx is None or qemu is None:
        pytest.skip("no aarch64 cross toolchain or qemu-user: apt-get install g++-aarch64-linux-gnu qemu-user")
    _compile(cxx, [*variants.by_name(name).cflags, "-static"], tmp_path / "driver")
    cmd = ([qemu] if qemu else []) + [str(tmp_path / "driver"), str(vectors)]
    check(subprocess.run(cmd, capture_output=True, text=True, timeout=300), vec_name, True)


# ---- the int8 prefill GEMM (rowwork.cpp's panels and tiles) through engine/fastpath/kernels/ctest/gemm.cpp

GEMM = DRIVER.with_name("gemm.cpp")
GEMM_TYPES = sorted(INT8_TYPES | {"Q8_0"})  # raw blocks, as the loader keeps all of them but Q8_0 (tested too)
GEMM_M = 7  # tokens: a tile of 4 and a last 3 (neon-i8mm pairs tokens: one is paired with itself)


def write_gemm_vectors(path: Path) -> None:
    with open(path, "wb") as f:
        for i, t in enumerate(GEMM_TYPES):
            k = 256 * 3 if RAW_TYPES[t][1] == 256 else 32 * 5
            n = 16  # the GEMM's panels are whole 16-row blocks
            rng = np.random.default_rng(200 + i)
            raw = np.ascontiguousarray(random_blocks(t, n, k, rng)).reshape(n, -1)
            dense = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[t]).reshape(n, k).astype(np.float64)
            x = rng.standard_normal((GEMM_M, k)).astype(np.float32)
            xq = q8.dequantized(x, 32)  # what the library's quantize_q8 must make of x
            f.write(struct.pack("<5q", RAW_TYPES[t][0], n, k, raw.shape[1], GEMM_M))
            f.write(raw.tobytes() + x.tobytes())
            f.write((xq @ dense.T).tobytes() + (np.abs(xq) @ np.abs(dense).T).tobytes())


@pytest.fixture(scope="module")
def gemm_vectors(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("gemm") / "gemm.bin"
    write_gemm_vectors(path)
    return path


def _torch_include() -> str:
    import torch

    return str(Path(torch.__file__).parent / "include")  # c10's headers only: no torch library is linked


@pytest.mark.parametrize(
    "name, multiply",
    [
        ("avx2", "vpmaddubsw ymm"),
        ("avx2-vnni", "vpdpbusd ymm"),
        ("avx2-vnni-twin", "vpdpbusd ymm"),
        ("avx512-vnni", "vpdpbusd zmm"),
        ("neon", "smull"),
        ("neon-dotprod", "sdot"),
        ("neon-i8mm", "smmla"),
    ],
)
def test_int8_prefill_gemm_matches_the_references(gemm_vectors, tmp_path, name, multiply):
    """Each int8 variant's prefill GEMM (every quantized type as raw blocks, 16 rows, 7 tokens) against
    the float64 product of gguf's dequantized weights and the int8-rounded activations: natively where
    this CPU runs the variant, the ARM64 ones cross-compiled and run under qemu-user (its default CPU,
    max, has dotprod and i8mm), avx2-vnni's also through its twin where the CPU has AVX512-VNNI."""
    twin = name.endswith("-twin")
    v = variants.by_name(name.removesuffix("-twin"))
    flags = TWIN_FLAGS if twin else v.cflags
    qemu = None
    if v.arch == "aarch64" and variants.arch() != "aarch64":
        cxx, qemu = shutil.which("aarch64-linux-gnu-g++"), shutil.which("qemu-aarch64")
        if cxx is None or qemu is None:
            pytest.skip("no aarch64 cross toolchain or qemu-user: apt-get install g++-aarch64-linux-gnu qemu-user")
    else:
        lacks = sorted(TWIN_NEEDS - variants.cpu_flags()) if twin else variants.missing(v)
        if lacks:
            pytest.skip(f"this CPU cannot run {name}: lacks {' '.join(lacks)}")
        cxx = shutil.which("g++") or shutil.which("c++")
        if cxx is None:
            pytest.skip("no C++ compiler (g++/c++) to build the test driver")
    exe = tmp_path / "gemm"
    r = subprocess.run(
        [cxx, "-O2", "-std=c++17", *flags, *(["-static"] if qemu else []), "-I", _torch_include()]
        + ["-o", str(exe), str(GEMM)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = subprocess.run(
        ([qemu] if qemu else []) + [str(exe), str(gemm_vectors)], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stdout + out.stderr
    head, *lines = out.stdout.splitlines()
    assert head == f"multiply {multiply}", out.stdout
    names = {RAW_TYPES[t][0]: t for t in GEMM_TYPES}
    assert [names[int(line.split()[1])] for line in lines] == GEMM_TYPES, out.stdout  # every type ran ...
    assert [line for line in lines if line.endswith(" -")] == [], out.stdout  # ... in the int8 GEMM
