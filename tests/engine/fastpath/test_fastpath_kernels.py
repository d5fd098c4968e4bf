"""The fast-path kernels against the ggml project's own dequantizer and a float64 matmul.

Fresh random GGUF blocks for every shape of the default model (plus odd shapes that take the tail
paths). Tolerances, elementwise, with bound = |W| @ |x| (the size of the sum before cancellation):
  * f32 activations (exact dequantization, fp32 accumulation):  |y - y64| <= 2e-6 * K^0.5 * bound
  * q8 activations: the same, against a float64 model of the int8 activation quantization
  * bf16 GEMM prefill: |y - y64| <= 1e-2 * bound (x and W rounded to bf16: 2^-8 each)
"""

from __future__ import annotations

import os

import gguf
import numpy as np
import pytest
import torch
from opscope.engine.fastpath.kernels.build import cache_root

# The test fixtures isolate XDG dirs per test; the compiled kernels are a build cache, not user
# data: keep using the real one so a test session does not rebuild them (a minute of compiling).
os.environ.setdefault("OPSCOPE_KERNEL_CACHE", str(cache_root()))

from opscope.engine.fastpath.kernels import dequantize_reference, load_kernels, pack
from opscope.engine.fastpath.kernels.packing import random_blocks
from opscope.engine.testing import q8

# (N, K) of every weight matmul in SmolLM2-135M: q/o, k/v, gate/up, down, the tied Q8_0 head.
MODEL_SHAPES = [(576, 576), (192, 576), (1536, 576), (576, 1536), (49152, 576)]
ODD_SHAPES = [(7, 96), (13, 544), (5, 32)]  # rows not a multiple of 4; odd block counts (3, 17, 1)
TYPES = {"Q4_1": gguf.GGMLQuantizationType.Q4_1, "Q8_0": gguf.GGMLQuantizationType.Q8_0}


@pytest.fixture(scope="module")
def kern():
    return load_kernels()


def ggml_dense(ggml_type: str, raw: np.ndarray, n: int, k: int) -> np.ndarray:
    return gguf.quants.dequantize(raw, TYPES[ggml_type]).reshape(n, k).astype(np.float64)


def check_close(y: torch.Tensor, ref: np.ndarray, bound: np.ndarray, rel: float) -> None:
    err = np.abs(y.double().numpy() - ref)
    worst = float((err / np.maximum(bound, 1e-30)).max())
    assert worst <= rel, f"error {worst:.3g} x bound exceeds {rel:g}"


def run(kern, w, x: torch.Tensor, act_mode: int, gemm_min_rows: int = 1 << 30, dtype=torch.float32):
    return kern.qlinear(x, w.qs, w.d, w.m, w.qtype, act_mode, gemm_min_rows, dtype)


@pytest.mark.parametrize("ggml_type", ["Q4_1", "Q8_0"])
@pytest.mark.parametrize("shape", MODEL_SHAPES + ODD_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("variant", [1, 2])
def test_matvec_f32_matches_float64(kern, ggml_type, shape, variant):
    n, k = shape
    rng = np.random.default_rng(n * 31 + k)
    raw = random_blocks(ggml_type, n, k, rng)
    w, dense = pack(ggml_type, raw, (n, k)), ggml_dense(ggml_type, raw, n, k)
    x = torch.randn(2, k, generator=torch.Generator().manual_seed(k))
    kern.set_kernel_variant(variant)
    try:
        y = run(kern, w, x, 0)
    finally:
        kern.set_kernel_variant(2)
    xd = x.double().numpy()
    check_close(y, xd @ dense.T, np.abs(xd) @ np.abs(dense).T, 2e-6 * k**0.5)


@pytest.mark.parametrize("ggml_type", ["Q4_1", "Q8_0"])
@pytest.mark.parametrize("shape", [(576, 576), (576, 1536), (4096, 576)] + ODD_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("variant", [1, 2])
def test_matvec_q8_matches_its_float64_model(kern, ggml_type, shape, variant):
    if not kern.has_int8_soa():
        pytest.skip("no int8 kernels in this variant: q8 activations fall back to the exact f32 path")
    n, k = shape
    rng = np.random.default_rng(n * 17 + k)
    raw = random_blocks(ggml_type, n, k, rng)
    w, dense = pack(ggml_type, raw, (n, k)), ggml_dense(ggml_type, raw, n, k)
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(n))
    kern.set_kernel_variant(variant)
    try:
        y = run(kern, w, x, 1)
    finally:
        kern.set_kernel_variant(2)
    xq, xd = q8.dequantized(x.numpy(), 32), x.double().numpy()
    # llama.cpp's q8 scheme exactly: the dense weights (Q4_1's "+m" included) times the quantized x
    check_close(y, xq @ dense.T, np.abs(xd) @ np.abs(dense).T, 2e-6 * k**0.5)
    # and the quantization error itself stays small: int8 activations cost < 2 % of the bound
    check_close(y, xd @ dense.T, np.abs(xd) @ np.abs(dense).T, 2e-2)


@pytest.mark.parametrize("ggml_type", ["Q4_1", "Q8_0"])
def test_dequantize_equals_ggml(kern, ggml_type):
    rng = np.random.default_rng(3)
    raw = random_blocks(ggml_type, 64, 576, rng)
    w = pack(ggml_type, raw, (64, 576))
    expect = torch.from_numpy(ggml_dense(ggml_type, raw, 64, 576)).float()
    assert torch.equal(kern.dequantize(w.qs, w.d, w.m, w.qtype, 576, torch.float32), expect)
    assert torch.equal(dequantize_reference(w), expect)


@pytest.mark.parametrize("ggml_type", ["Q4_1", "Q8_0"])
@pytest.mark.parametrize("dtype,rel", [(torch.float32, 1e-4), (torch.bfloat16, 1e-2)])
def test_gemm_path_for_many_rows(kern, ggml_type, dtype, rel):
    n, k = 576, 1536
    raw = random_blocks(ggml_type, n, k, np.random.default_rng(5))
    w, dense = pack(ggml_type, raw, (n, k)), ggml_dense(ggml_type, raw, n, k)
    x = torch.randn(2, 9, k)  # [B, T, K]: 18 rows >= gemm_min_rows
    y = run(kern, w, x, 0, gemm_min_rows=8, dtype=dtype)
    assert y.shape == (2, 9, n) and y.dtype == torch.float32
    xd = x.reshape(-1, k).double().numpy()
    check_close(y.reshape(-1, n), xd @ dense.T, np.abs(xd) @ np.abs(dense).T, rel)


def test_row_order_permutes_rows():
    raw = random_blocks("Q4_1", 8, 64, np.random.default_rng(9))
    order = np.array([3, 1, 0, 2, 7, 6, 5, 4])
    assert torch.equal(
        dequantize_reference(pack("Q4_1", raw, (8, 64), order)), dequantize_reference(pack("Q4_1", raw, (8, 64)))[order]
    )


def test_unsupported_type_is_a_typed_error():
    from opscope.engine.core.errors import UnsupportedModelError

    with pytest.raises(UnsupportedModelError, match="IQ2_XXS"):
        pack("IQ2_XXS", np.zeros((1, 66), np.uint8), (1, 256))


def test_bad_packed_weights_are_rejected(kern):
    w = pack("Q8_0", random_blocks("Q8_0", 4, 64, np.random.default_rng(1)), (4, 64))
    with pytest.raises(RuntimeError, match="K must be a multiple of 32"):
        kern.qlinear(torch.randn(1, 48), w.qs, w.d, w.m, w.qtype, 0, 8, torch.float32)
    with pytest.raises(RuntimeError, match="float32 activations"):
        kern.qlinear(torch.randn(1, 64).double(), w.qs, w.d, w.m, w.qtype, 0, 8, torch.float32)


def test_fastpath_build_command_reports_the_kernels(capsys):
    import argparse

    from opscope.engine.cli.commands import fastpath as commands

    parser = argparse.ArgumentParser()
    commands.register(parser.add_subparsers())
    args = parser.parse_args(["fastpath", "build"])
    assert args.func(args) == 0
    assert "avx512=" in capsys.readouterr().out
