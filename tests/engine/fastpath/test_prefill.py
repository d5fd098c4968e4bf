"""Prefill GEMM over quantized weights (engine/fastpath/kernels/csrc/prefill.cpp), against the ggml project's
own decoders (gguf.quants.dequantize) and float64 numpy products.

Random blocks of every type (odd row counts, K a multiple of the block size), prompt lengths M in
{1, 7, 64, 300}, one and two threads, many panels (a small panel budget) and one. Tolerance,
elementwise, with bound = |x| @ |W|^T: |y - y64| <= 1e-5 * bound (exact weights, float32 sums).
The fused gate/up/activation op against the same reference of act(x G^T) * (x U^T). A real prefill's
logits against the older dequantize-tile path within 1e-4 of the largest logit.
"""

from __future__ import annotations

import os

import gguf
import numpy as np
import pytest
import torch
from opscope.engine.fastpath.kernels.build import cache_root

# The compiled kernels are a build cache, not user data: keep the real one (see test_fastpath_kernels).
os.environ.setdefault("OPSCOPE_KERNEL_CACHE", str(cache_root()))

from opscope.engine.fastpath.kernels import load_kernels, pack, variants
from opscope.engine.fastpath.kernels.packing import RAW_TYPES, random_blocks
from opscope.engine.fastpath.qlinear import _raw_has_q8, _soa_has_q8

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
SOA = ["Q4_0", "Q4_1", "Q8_0"]  # also held in the structure-of-arrays layout ("auto")
CASES = [(t, "raw") for t in TYPES] + [(t, "auto") for t in SOA]
ROWS = (1, 7, 64, 300)
N = 37  # odd: the last panel is a partial one


@pytest.fixture(scope="module", autouse=True)
def kern():
    k = load_kernels()
    yield k
    torch.ops.opscope.prefill_config(256 << 10, 1, 1)  # the defaults, whatever a test changed


@pytest.fixture
def threads():
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def k_for(ggml_type: str) -> int:
    return 256 * 3 if RAW_TYPES[ggml_type][1] == 256 else 32 * 7


def weights(ggml_type: str, layout: str = "raw", n: int = N, seed: int = 0, k: int | None = None):
    """(PackedWeight, ggml's dequantized float32 [n, K])."""
    k = k or k_for(ggml_type)
    raw = random_blocks(ggml_type, n, k, np.random.default_rng(seed + 100 * TYPES.index(ggml_type)))
    dense = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[ggml_type]).reshape(n, k).astype(np.float32)
    return pack(ggml_type, raw, (n, k), layout=layout), dense


def check(y: torch.Tensor, x: torch.Tensor, dense: np.ndarray, rel: float = 1e-5) -> None:
    xd, wd = x.double().numpy(), dense.astype(np.float64)
    err = np.abs(y.double().numpy() - xd @ wd.T)
    bound = np.abs(xd) @ np.abs(wd).T
    worst = float((err / np.maximum(bound, 1e-30)).max())
    assert worst <= rel, f"error {worst:.3g} x bound exceeds {rel:g}"


def qgemm(x, w):
    return torch.ops.opscope.qgemm(x, w.qs, w.d, w.m, w.qtype)


@pytest.mark.parametrize("ggml_type,layout", CASES)
def test_gemm_matches_ggml_reference(ggml_type, layout, threads):
    w, dense = weights(ggml_type, layout)
    gen = torch.Generator().manual_seed(1)
    for n_threads, panel_bytes in ((2, 256 << 10), (1, 256 << 10), (2, 4096)):  # 4 KB: 16-row panels
        threads(n_threads)
        torch.ops.opscope.prefill_config(panel_bytes, -1, -1)
        for m in ROWS:
            x = torch.randn(m, dense.shape[1], generator=gen)
            y = qgemm(x, w)
            assert y.shape == (m, N) and y.dtype == torch.float32
            check(y, x, dense)
    torch.ops.opscope.prefill_config(256 << 10, -1, -1)


def test_gemm_keeps_leading_dims_and_checks_inputs():
    w, dense = weights("Q4_K")
    x = torch.randn(2, 5, dense.shape[1])
    y = qgemm(x, w)
    assert y.shape == (2, 5, N)
    check(y.reshape(10, N), x.reshape(10, -1), dense)
    with pytest.raises(RuntimeError, match="float32"):
        qgemm(x.double(), w)
    with pytest.raises(RuntimeError):
        qgemm(torch.randn(3, dense.shape[1] + 256), w)  # K does not match the blocks


def test_gemm_without_mkl_uses_torch_per_panel():
    w, dense = weights("Q6_K")
    x = torch.randn(64, dense.shape[1])
    torch.ops.opscope.prefill_config(-1, 0, -1)
    try:
        check(qgemm(x, w), x, dense)
    finally:
        torch.ops.opscope.prefill_config(-1, 1, -1)


def test_values_do_not_depend_on_the_panel_split(threads):
    """Panels are handed out dynamically (a shared counter) and sized by the thread count: which
    thread takes a panel and how many rows a panel has must not change any output value, for the
    GEMM and the fused gate/up/activation alike. Bit for bit over 1-3 threads (3 on fewer cores:
    a thread that gets no core for a while) and 16-row panels to a single one."""
    w, dense = weights("IQ4_NL", n=301, k=32 * 18)
    u, _ = weights("Q4_K", n=301, seed=1, k=256 * 3)
    x = torch.randn(64, dense.shape[1], generator=torch.Generator().manual_seed(3))
    xu = torch.randn(64, 768, generator=torch.Generator().manual_seed(4))
    g, _ = weights("Q5_0", n=301, seed=2, k=768)
    first = None
    try:
        for n_threads in (1, 2, 3):
            threads(n_threads)
            for panel_bytes in (256 << 10, 4096, 64 << 20):
                torch.ops.opscope.prefill_config(panel_bytes, -1, -1)
                y = qgemm(x, w)
                h = torch.ops.opscope.qglu(xu, g.qs, g.d, g.m, g.qtype, u.qs, u.d, u.m, u.qtype, 0)
                if first is None:
                    first = (y, h)
                    check(y, x, dense)
                assert torch.equal(y, first[0]) and torch.equal(h, first[1]), (n_threads, panel_bytes)
    finally:
        torch.ops.opscope.prefill_config(256 << 10, -1, -1)


def act64(g: np.ndarray, gelu: bool) -> np.ndarray:
    if gelu:
        return 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g**3)))
    return g / (1 + np.exp(-g))


@pytest.mark.parametrize(
    "gate_type,up_type,gelu",
    [("Q4_K", "Q6_K", False), ("Q4_0", "Q4_0", False), ("IQ4_XS", "Q8_0", True), ("Q5_0", "BF16", False)],
)
def test_glu_matches_reference(gate_type, up_type, gelu, threads):
    layout = "auto" if gate_type in SOA else "raw"
    g, gd = weights(gate_type, layout, n=45, seed=3, k=768)  # 768: whole blocks of every type
    u, ud = weights(up_type, "raw", n=45, seed=4, k=768)
    threads(2)
    for m in ROWS:
        # scaled so the activation sees its whole range (|x G^T| up to ~10)
        x = torch.randn(m, gd.shape[1], generator=torch.Generator().manual_seed(m)) * 8
        h = torch.ops.opscope.qglu(x, g.qs, g.d, g.m, g.qtype, u.qs, u.d, u.m, u.qtype, int(gelu))
        xd = x.double().numpy()
        g64, u64 = xd @ gd.astype(np.float64).T, xd @ ud.astype(np.float64).T
        bound = (np.abs(xd) @ np.abs(gd.astype(np.float64)).T) * np.abs(u64) + np.abs(act64(g64, gelu)) * (
            np.abs(xd) @ np.abs(ud.astype(np.float64)).T
        )
        err = np.abs(h.double().numpy() - act64(g64, gelu) * u64)
        assert float((err / np.maximum(bound, 1e-30)).max()) <= 1e-5


# -- bfloat16 products (prefill_dtype=bf16: a bf16 model, or int8 activations on a CPU with native bf16) --


def qlinear_bf16(x, w):
    return torch.ops.opscope.qlinear(x, w.qs, w.d, w.m, w.qtype, 0, 8, torch.bfloat16)


def torch_bf16(x: torch.Tensor, dense: np.ndarray) -> torch.Tensor:
    """torch's own bf16 GEMM of the same rounded operands: what ours must equal bit for bit."""
    return torch.mm(x.bfloat16(), torch.from_numpy(dense).bfloat16().t()).float()


def check_bf16(y: torch.Tensor, x: torch.Tensor, dense: np.ndarray) -> None:
    """Against float64 products of the bf16-rounded operands: the output rounded to bf16 (2^-8
    relative) plus float32 sums (1e-5 of |x| @ |W|^T)."""
    xb, wb = x.bfloat16().double().numpy(), torch.from_numpy(dense).bfloat16().double().numpy()
    ref = xb @ wb.T
    err = np.abs(y.double().numpy() - ref)
    assert (err <= 2.0**-8 * np.abs(ref) + 1e-5 * (np.abs(xb) @ np.abs(wb).T)).all()


@pytest.mark.parametrize("ggml_type,layout", CASES)
def test_bf16_gemm_rounds_the_decoded_weights_as_torch_does(ggml_type, layout, threads):
    w, dense = weights(ggml_type, layout)
    threads(2)
    for m in (8, 64, 300):
        x = torch.randn(m, dense.shape[1], generator=torch.Generator().manual_seed(m))
        y = qlinear_bf16(x, w)
        assert y.shape == (m, N) and y.dtype == torch.float32
        assert torch.equal(y, torch_bf16(x, dense))  # the decode and its rounding to bf16 are torch's
        check_bf16(y, x, dense)


def test_bf16_gemm_of_a_matrix_larger_than_a_tile(threads):
    """4160 rows of 4096: tiles of 2048, 2048 and 64 rows (at most 16 MiB of bf16 at a time)."""
    w, dense = weights("Q8_0", n=4160, k=4096)
    threads(2)
    x = torch.randn(16, 4096, generator=torch.Generator().manual_seed(5))
    y = qlinear_bf16(x, w)
    assert y.shape == (16, 4160)
    for r0, r1 in ((0, 2048), (2048, 4096), (4096, 4160)):
        assert torch.equal(y[:, r0:r1], torch_bf16(x, dense[r0:r1]))
    check_bf16(y, x, dense)


@pytest.mark.parametrize("gate_type,up_type,gelu", [("Q4_K", "Q6_K", False), ("IQ4_XS", "Q8_0", True)])
def test_bf16_glu_is_the_activation_of_the_bf16_products(gate_type, up_type, gelu, threads):
    g, gd = weights(gate_type, "raw", n=45, seed=3, k=768)
    u, ud = weights(up_type, "raw", n=45, seed=4, k=768)
    threads(2)
    x = torch.randn(64, 768, generator=torch.Generator().manual_seed(6)) * 8
    h = torch.ops.opscope.qglu(x, g.qs, g.d, g.m, g.qtype, u.qs, u.d, u.m, u.qtype, int(gelu), torch.bfloat16)
    g32, u32 = (torch_bf16(x, d).double().numpy() for d in (gd, ud))
    err = np.abs(h.double().numpy() - act64(g32, gelu) * u32)
    assert (err <= 1e-5 * (np.abs(g32) + 1) * (np.abs(u32) + 1)).all()
    with pytest.raises(RuntimeError, match="float32, bfloat16 or int8"):
        torch.ops.opscope.qglu(x, g.qs, g.d, g.m, g.qtype, u.qs, u.d, u.m, u.qtype, 0, torch.float16)


def test_bf16_glu_bits_do_not_depend_on_the_row_length(threads):
    """The bf16 GLU widens the products a chunk at a time (512 values): a value's bits are the same in
    a row of 1100 (two chunks and a tail of 76) as in a row of 45 (a tail alone)."""
    n, k = 1100, 256
    rng = np.random.default_rng(7)
    raws = [random_blocks(t, n, k, rng) for t in ("Q4_K", "Q8_0")]
    threads(2)
    x = torch.randn(24, k, generator=torch.Generator().manual_seed(8)) * 4

    def glu(rows: int) -> torch.Tensor:
        g, u = (pack(t, raw[:rows], (rows, k), layout="raw") for t, raw in zip(("Q4_K", "Q8_0"), raws, strict=True))
        return torch.ops.opscope.qglu(x, g.qs, g.d, g.m, g.qtype, u.qs, u.d, u.m, u.qtype, 0, torch.bfloat16)

    full, short = glu(n), glu(45)
    assert torch.equal(full[:, :45], short)
    dense = [
        gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[t]).reshape(n, k)
        for t, raw in zip(("Q4_K", "Q8_0"), raws, strict=True)
    ]
    g32, u32 = (torch_bf16(x, d.astype(np.float32)).double().numpy() for d in dense)
    err = np.abs(full.double().numpy() - act64(g32, False) * u32)
    assert (err <= 1e-5 * (np.abs(g32) + 1) * (np.abs(u32) + 1)).all()


B32_TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL"]  # the 32-weight block types
INT8_TYPES = B32_TYPES + ["Q4_K", "Q5_K", "IQ4_XS", "Q2_K", "Q3_K", "Q6_K"]  # every quantized type
INT8_CASES = [(t, "raw") for t in INT8_TYPES] + [(t, "auto") for t in SOA]


def q8_rows(x: np.ndarray) -> np.ndarray:
    """x [M, K] through llama.cpp's per-32 int8 activations (kernels.cpp's prepare_activation: scale
    amax/127, nearest with ties to even, in float32), back in float64."""
    m, k = x.shape
    xb = x.reshape(m, k // 32, 32).astype(np.float32)
    scale = np.abs(xb).max(-1, keepdims=True) / np.float32(127)
    inv = np.divide(np.float32(1), scale, out=np.zeros_like(scale), where=scale > 0)
    return (np.rint(xb * inv).astype(np.float64) * scale.astype(np.float64)).reshape(m, k)


def int8_expected(ggml_type: str, n: int) -> bool:
    """Where this process's kernels have the int8 prefill GEMM: every variant with int8 kernels, every
    type of INT8_TYPES, panels of whole 16-row registers."""
    return variants.chosen().int8 and ggml_type in INT8_TYPES and n % 16 == 0


@pytest.mark.parametrize("ggml_type,layout", INT8_CASES)
@pytest.mark.parametrize("n", [128, 16])  # panels of 48, 48, 32; one of 16
def test_int8_gemm_is_the_product_with_int8_activations(ggml_type, layout, n, threads):
    w, dense = weights(ggml_type, layout, n=n, seed=11)
    k = dense.shape[1]
    group = torch.ops.opscope.int8_prefill_group(w.qtype, k, n)
    supported = group > 0
    assert supported == int8_expected(ggml_type, n)
    assert group in ((16,) if ggml_type in ("Q2_K", "Q3_K", "Q6_K") else (32,)) or not supported
    if not supported:
        pytest.skip(f"no int8 kernels in this process's kernel variant ({variants.chosen().name})")
    threads(2)
    wd = dense.astype(np.float64)
    # the decode step's int8 activations are the same (per 32) for the 32-weight block types that have
    # int8 matvecs (raw Q8_0's takes float32); the K types' are per 256
    decode_int8 = _soa_has_q8() if layout == "auto" else ggml_type in B32_TYPES and _raw_has_q8(ggml_type)
    for m in (8, 13, 64):
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)) * 3
        y = torch.ops.opscope.qlinear(x, w.qs, w.d, w.m, w.qtype, 1, 8, torch.int8)
        xq = q8_rows(x.numpy())
        err, bound = np.abs(y.double().numpy() - xq @ wd.T), np.abs(xq) @ np.abs(wd).T
        assert (err <= 1e-5 * bound + 1e-30).all(), f"{m} rows: worst {float((err / bound).max()):.3g} of the bound"
        if decode_int8:  # the decode step's int8 matvec, row by row, computes the same products
            rows = torch.ops.opscope.qlinear(x, w.qs, w.d, w.m, w.qtype, 1, 1 << 30, torch.float32)
            assert (np.abs(y.double().numpy() - rows.double().numpy()) <= 2e-5 * bound + 1e-30).all()


@pytest.mark.parametrize("native", [True, False])
def test_int8_prefill_is_taken_wherever_the_kernels_have_it(native, monkeypatch):
    """prefill_dtype=int8: every type the variant's int8 GEMM takes, the 16-weight-group ones too,
    whether or not bf16 is native; the others fall back to bf16 where native, else float32."""
    import opscope.engine.fastpath.qlinear as ql

    monkeypatch.setattr(ql, "native_bf16", lambda: native)
    fallback = torch.bfloat16 if native else torch.float32
    for ggml_type, layout in (("Q4_K", "raw"), ("Q6_K", "raw"), ("Q4_0", "raw"), ("Q8_0", "auto"), ("F16", "raw")):
        w, _ = weights(ggml_type, layout, n=32, seed=15)
        lin = ql.QuantLinear(w, act_mode=1, gemm_dtype="int8")
        assert lin.gemm_dtype == (torch.int8 if int8_expected(ggml_type, 32) else fallback), ggml_type


def test_int8_glu_is_the_activation_of_the_int8_products(threads):
    g, gd = weights("Q4_0", "auto", n=96, seed=12)
    u, ud = weights("IQ4_NL" if int8_expected("IQ4_NL", 96) else "Q5_0", "raw", n=96, seed=13)
    if not int8_expected("Q4_0", 96):
        pytest.skip(f"no int8 kernels in this process's kernel variant ({variants.chosen().name})")
    threads(2)
    x = torch.randn(21, gd.shape[1], generator=torch.Generator().manual_seed(14)) * 2
    h = torch.ops.opscope.qglu(x, g.qs, g.d, g.m, g.qtype, u.qs, u.d, u.m, u.qtype, 0, torch.int8)
    xq = q8_rows(x.numpy())
    g64, u64 = xq @ gd.astype(np.float64).T, xq @ ud.astype(np.float64).T
    err = np.abs(h.double().numpy() - act64(g64, False) * u64)
    assert (err <= 1e-5 * (np.abs(g64) + 1) * (np.abs(u64) + 1)).all()


def test_int8_projections_of_one_input_equal_each_alone(threads):
    """q, k and v as one op (x quantized once, one parallel region): the same bits as each
    projection's own int8 GEMM; a 16-weight-group type beside 32-weight ones, panels of 48, 32, 16."""
    mats = [
        weights(t, "raw", n=n, seed=16 + i, k=768)
        for i, (t, n) in enumerate((("Q4_K", 96), ("Q6_K", 32), ("Q5_0", 16)))
    ]
    if not all(int8_expected(t, 16) for t in ("Q4_K", "Q6_K", "Q5_0")):
        pytest.skip(f"no int8 kernels in this process's kernel variant ({variants.chosen().name})")
    threads(2)
    x = torch.randn(2, 19, 768, generator=torch.Generator().manual_seed(17))
    ws = [w for w, _ in mats]
    ys = torch.ops.opscope.qgemms_int8(
        x, [w.qs for w in ws], [w.d for w in ws], [w.m for w in ws], [w.qtype for w in ws]
    )
    for y, w in zip(ys, ws, strict=True):
        alone = torch.ops.opscope.qlinear(x, w.qs, w.d, w.m, w.qtype, 1, 8, torch.int8)
        assert y.shape == alone.shape == (2, 19, w.shape[0]) and torch.equal(y, alone)


def test_fused_qkv_is_installed_with_int8_prefill_and_changes_no_logit():
    """The embedded model with activations=q8: every layer's q, k, v run as one op where the
    variant has the int8 GEMM (its Q4_1 projections), and its prompt logits are those of the three
    projections run one by one, bit for bit."""
    from opscope.engine.api import load

    lm = load(fastpath="activations=q8")
    layers = lm.model.layers
    if not int8_expected("Q4_1", 64):
        assert all(layer.attn.project is None for layer in layers)
        pytest.skip(f"no int8 kernels in this process's kernel variant ({variants.chosen().name})")
    assert all(layer.attn.project is not None for layer in layers)
    ids = torch.randint(0, lm.config.vocab_size, (1, 33), generator=torch.Generator().manual_seed(18))
    with torch.inference_mode():
        fused = lm.model(ids, 0)
        hooks = [layer.attn.project for layer in layers]
        try:
            for layer in layers:
                layer.attn.project = None
            apart = lm.model(ids, 0)
        finally:
            for layer, hook in zip(layers, hooks, strict=True):
                layer.attn.project = hook
    assert torch.equal(fused, apart)


def test_glu_rejects_mismatched_projections():
    g, gd = weights("Q4_K", n=45)
    u, _ = weights("Q4_K", n=44)
    with pytest.raises(RuntimeError, match="differ"):
        torch.ops.opscope.qglu(torch.randn(9, gd.shape[1]), g.qs, g.d, g.m, g.qtype, u.qs, u.d, u.m, u.qtype, 0)


# -- the fused attention and RMSNorm -------------------------------------------------------------


def _rope64(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), dim=-1) * sin


@pytest.mark.parametrize("B,T,H,KH,D,start", [(1, 150, 9, 3, 64, 0), (2, 70, 4, 4, 32, 0), (1, 65, 6, 2, 16, 19)])
def test_prefill_attn_matches_float64_causal_attention(B, T, H, KH, D, start, threads):
    """RoPE, the cache write and grouped causal attention over cache positions 0..start+T against
    a float64 reference; the cache outside [start, start+T) untouched."""
    threads(2)
    g = torch.Generator().manual_seed(B * T + start)
    q, k, v = (torch.randn(B, T, n, D, generator=g) for n in (H, KH, KH))
    ang = torch.arange(start, start + T).double().view(1, T, 1, 1) * torch.rand(D // 2, generator=g).double()
    cos, sin = torch.cat((ang.cos(), ang.cos()), -1).float(), torch.cat((ang.sin(), ang.sin()), -1).float()
    kc, vc = torch.randn(B, start + T + 5, KH, D, generator=g), torch.randn(B, start + T + 5, KH, D, generator=g)
    kc0, vc0 = kc.clone(), vc.clone()
    out = torch.ops.opscope.prefill_attn(q, k, v, cos, sin, kc, vc, start, 0.0)
    k64 = kc0.double().clone()
    k64[:, start : start + T] = _rope64(k.double(), cos.double(), sin.double())
    v64 = vc0.double().clone()
    v64[:, start : start + T] = v.double()
    assert torch.allclose(kc.double(), k64, atol=1e-5) and torch.equal(vc[:, start : start + T], v)
    assert torch.equal(kc[:, :start], kc0[:, :start]) and torch.equal(vc[:, start + T :], vc0[:, start + T :])
    S = start + T
    keys = k64[:, :S].transpose(1, 2).repeat_interleave(H // KH, 1)  # [B,H,S,D]
    vals = v64[:, :S].transpose(1, 2).repeat_interleave(H // KH, 1)
    scores = _rope64(q.double(), cos.double(), sin.double()).transpose(1, 2) @ keys.transpose(-1, -2) / D**0.5
    mask = torch.arange(S).view(1, S) <= torch.arange(start, S).view(T, 1)
    ref = (scores.masked_fill(~mask, float("-inf")).softmax(-1) @ vals).transpose(1, 2).reshape(B, T, H * D)
    assert out.shape == (B, T, H * D)
    assert (out.double() - ref).abs().max().item() < 1e-5


def test_rms_norm_matches_float64(threads):
    threads(2)
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(3, 41, 200, generator=g) * 4, torch.randn(200, generator=g)
    ref = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-6) * w.double()
    out = torch.ops.opscope.rms_norm(x, w, 1e-6)
    assert out.shape == x.shape and (out.double() - ref).abs().max().item() < 1e-5


# -- the real default model ----------------------------------------------------------------------


def test_prefill_logits_equal_the_previous_path():
    """The fast path's prefill (panel GEMMs, fused gate/up, one-pass RMSNorm, fused RoPE + cache +
    attention) against the older dequantize-tile path with separate gate/up GEMMs and activation and
    torch's norms and SDPA: every position's logits within 1e-4 of the largest."""
    import torch.nn.functional as F
    from opscope.engine.api import load
    from opscope.engine.fastpath.qlinear import QuantMLP, install_prefill_kernels

    lm = load(fastpath="activations=f32")  # the kernels even where "auto" leaves them (the baseline variant)
    model = lm.model
    assert all(isinstance(layer.mlp, QuantMLP) for layer in model.layers)
    ids = torch.randint(0, lm.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        new = model(ids, 0)
        torch.ops.opscope.prefill_config(-1, -1, 0)
        install_prefill_kernels(model, False)  # torch's RMSNorm, RoPE, cache writes and SDPA
        try:
            for layer in model.layers:  # the MLP as the model's own: gate, up, activation apart
                mlp = layer.mlp
                layer.mlp.forward = lambda x, mlp=mlp: mlp.down_proj(F.silu(mlp.gate_proj(x)) * mlp.up_proj(x))
            old = model(ids, 0)
        finally:
            torch.ops.opscope.prefill_config(-1, -1, 1)
            install_prefill_kernels(model, True)
    assert new.shape == old.shape == (1, 40, lm.config.vocab_size)
    assert (new - old).abs().max().item() <= 1e-4 * old.abs().max().item()
    assert torch.equal(new[0].argmax(-1), old[0].argmax(-1))
