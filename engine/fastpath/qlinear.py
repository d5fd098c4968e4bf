"""QuantLinear and QuantEmbedding: nn.Linear / nn.Embedding replacements fed from the GGUF's blocks.

Decode (few rows) runs the fused dequantize-matvec kernel; prefill (``gemm_min_rows`` rows or more)
dequantizes the weight tile by tile to bf16/fp32 and runs torch's GEMM. Both are one dispatcher op,
``torch.ops.opscope.qlinear``, which torch.compile treats as an opaque call. An embedding lookup
dequantizes only the rows it reads (``torch.ops.opscope.qembedding``); a tied output head and the
embedding share one set of blocks.
"""

from __future__ import annotations

import logging
import threading

import torch
import torch.nn as nn
import torch.nn.functional as F
from opscope.engine.fastpath.kernels import (
    KernelBuildError,
    PackedWeight,
    dequantize_reference,
    load_kernels,
    native_bf16,
)
from torch.utils import _pytree as pytree

log = logging.getLogger(__name__)

_GEMM_DTYPES = {"bf16": torch.bfloat16, "f32": torch.float32, "int8": torch.int8}
_fake_lock = threading.Lock()
_fake_registered = False
_q8_logged: set[str] = set()


def ensure_op() -> None:
    """Load the kernels (registering the ops) and their fake kernels for torch.compile, once."""
    global _fake_registered
    load_kernels()
    with _fake_lock:
        if _fake_registered:
            return

        @torch.library.register_fake("opscope::qlinear")
        def _fake(x, qs, d, m, qtype, act_mode, gemm_min_rows, gemm_dtype):
            return x.new_empty((*x.shape[:-1], qs.shape[0]))

        @torch.library.register_fake("opscope::qgemm")
        def _fake_gemm(x, qs, d, m, qtype):
            return x.new_empty((*x.shape[:-1], qs.shape[0]))

        @torch.library.register_fake("opscope::qglu")
        def _fake_glu(x, gqs, gd, gm, gtype, uqs, ud, um, utype, act, gemm_dtype=None):
            return x.new_empty((*x.shape[:-1], gqs.shape[0]))

        @torch.library.register_fake("opscope::qgemms_int8")
        def _fake_gemms(x, qs, d, m, qtype):
            return [x.new_empty((*x.shape[:-1], q.shape[0])) for q in qs]

        @torch.library.register_fake("opscope::rms_norm")
        def _fake_rms_norm(x, w, eps):
            return torch.empty_like(x)

        @torch.library.register_fake("opscope::prefill_attn")
        def _fake_prefill_attn(q, k, v, cos, sin, kcache, vcache, start, scale):
            return q.new_empty((q.shape[0], q.shape[1], q.shape[2] * q.shape[3]))

        @torch.library.register_fake("opscope::qembedding")
        def _fake_embedding(idx, qs, d, m, qtype, k):
            return idx.new_empty((*idx.shape, k), dtype=torch.float32)

        _fake_registered = True


def _raw_has_q8(ggml_type: str) -> bool:
    """Whether the kernels built here run raw blocks of ``ggml_type`` with int8 activations."""
    from opscope.engine.fastpath.kernels.packing import RAW_TYPES

    try:
        return bool(load_kernels().raw_has_q8(RAW_TYPES[ggml_type][0]))
    except KernelBuildError:
        return False


def _int8_pays(packed: PackedWeight) -> bool:
    """Whether this matrix's prefill runs as an int8 GEMM: wherever the loaded kernels have one for
    it (every quantized type on every variant with int8 kernels). The 16-weight-group types (Q2_K, Q3_K, Q6_K)
    too: with the vector quantizer and the shared regions they ran 1.02-1.05x of the native bf16
    GEMM at the model (docs/decisions/cpu-variants.md)."""
    n, k = packed.shape
    try:
        load_kernels()
        return torch.ops.opscope.int8_prefill_group(packed.qtype, k, n) > 0
    except KernelBuildError:
        return False


def int8_prefill_types() -> list[str]:
    """The quantized GGUF types whose prefill GEMMs run in int8 here with int8 activations."""
    from opscope.engine.fastpath.kernels.packing import RAW_TYPES

    quantized = [t for t in RAW_TYPES if t not in ("F32", "F16", "BF16")]
    return [
        t for t in quantized if _int8_pays(PackedWeight(t, torch.empty(0, dtype=torch.uint8), None, None, (16, 256)))
    ]


def _soa_has_q8() -> bool:
    """Whether the loaded variant runs the repacked Q4_1/Q8_0 matrices with int8 activations: the
    AVX-512 VNNI and AVX2 variants do. Elsewhere the kernels would take float32 activations anyway,
    so the module says so (act_mode 0) instead of promising a mode that does not run."""
    try:
        return bool(load_kernels().has_int8_soa())
    except KernelBuildError:
        return False


class BlocksWeight(torch.Tensor):
    """A quantized matrix seen as a float32 [N, K] tensor: shape, dtype and device are free (code
    that asks ``model.embed.weight.device`` pays nothing); any operation on it dequantizes the
    blocks first, so its values are the real weights."""

    @staticmethod
    def __new__(cls, packed: PackedWeight):
        return torch.Tensor._make_wrapper_subclass(cls, packed.shape, dtype=torch.float32, device=packed.qs.device)

    def __init__(self, packed: PackedWeight):
        self.packed = packed

    def __repr__(self) -> str:
        return f"BlocksWeight({self.packed.ggml_type}, shape={tuple(self.shape)})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        def dense(t):
            return dequantize(t.packed) if isinstance(t, BlocksWeight) else t

        return func(*pytree.tree_map(dense, args), **pytree.tree_map(dense, kwargs or {}))


def dequantize(packed: PackedWeight) -> torch.Tensor:
    """Dense float32 [N, K] of ``packed`` through the kernels (numpy reference where they are absent)."""
    try:
        kern = load_kernels()
    except KernelBuildError:  # no compiler here: the slower reference gives the same values
        return dequantize_reference(packed)
    return kern.dequantize(packed.qs, packed.d, packed.m, packed.qtype, packed.shape[1], torch.float32)


class _Blocks(nn.Module):
    """Holds one PackedWeight's tensors as (non-persistent) buffers."""

    def __init__(self, packed: PackedWeight):
        super().__init__()
        self.ggml_type, self.qtype = packed.ggml_type, packed.qtype
        self.shape = packed.shape
        self.register_buffer("qs", packed.qs, persistent=False)
        self.register_buffer("d", packed.d, persistent=False)
        self.register_buffer("m", packed.m, persistent=False)

    @property
    def packed(self) -> PackedWeight:
        return PackedWeight(self.ggml_type, self.qs, self.d, self.m, self.shape)

    @property
    def weight_bytes(self) -> int:
        return self.packed.nbytes


class QuantLinear(_Blocks):
    """y = x @ W^T (+ bias) with W kept quantized (engine.kernels.PackedWeight: SoA or raw blocks)."""

    def __init__(
        self,
        packed: PackedWeight,
        bias: torch.Tensor | None = None,
        *,
        act_mode: int = 0,
        gemm_min_rows: int = 8,
        gemm_dtype: str = "bf16",
    ):
        super().__init__(packed)
        self.out_features, self.in_features = packed.shape
        int8_kernel = self.int8_kernel
        if act_mode == 1 and not int8_kernel and packed.ggml_type not in _q8_logged:
            _q8_logged.add(packed.ggml_type)
            log.info(
                "fast path: no int8-activation kernel for %s; its matmuls use float32 activations", packed.ggml_type
            )
        self.act_mode = act_mode if int8_kernel else 0
        self.gemm_min_rows = gemm_min_rows
        if gemm_dtype == "int8" and not (self.act_mode == 1 and _int8_pays(packed)):
            gemm_dtype = "bf16" if native_bf16() else "f32"
        self.gemm_dtype = _GEMM_DTYPES[gemm_dtype]
        self.bias = bias

    @property
    def int8_kernel(self) -> bool:
        """Whether this CPU's kernels have an int8-activation matvec for the weight's type (act_mode 1)."""
        return _soa_has_q8() if not self.packed.raw else _raw_has_q8(self.packed.ggml_type)

    def matvec(self, x: torch.Tensor, act_mode: int) -> torch.Tensor:
        """The decode's matvec (x: [1, in_features] float32) with the given activations (0 exact, 1
        int8), whatever this layer's own mode: engine.diagnose times both."""
        return torch.ops.opscope.qlinear(
            x, self.qs, self.d, self.m, self.qtype, act_mode, self.gemm_min_rows, self.gemm_dtype
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype  # the kernels take float32; a bf16/fp16 model gets its own dtype back
        y = torch.ops.opscope.qlinear(
            x.float(), self.qs, self.d, self.m, self.qtype, self.act_mode, self.gemm_min_rows, self.gemm_dtype
        )
        if self.bias is not None:
            y = y + self.bias
        return y.to(dtype)

    def spec(self) -> tuple:
        """(qtype, qs, d, m, bias): the C++ DecodeModel's form of this linear."""
        return self.packed.spec(self.bias)

    @property
    def weight(self) -> torch.Tensor:
        """Dense float32 weight, computed on demand (code that inspects .weight, tests)."""
        return dequantize_reference(self.packed)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, {self.ggml_type}, "
            f"act_mode={self.act_mode}, gemm_min_rows={self.gemm_min_rows}, gemm_dtype={self.gemm_dtype}"
        )


class QuantMLP(nn.Module):
    """A gated MLP over QuantLinear projections (same submodule names as the model's MLP). A prompt's
    rows (``gemm_min_rows`` or more, float32, bfloat16 or int8 GEMMs) run gate, up and the activation as one op
    (``opscope::qglu``: no [T, hidden] gate/up outputs, no separate activation passes); fewer rows
    run the projections one by one."""

    def __init__(self, mlp: nn.Module):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = mlp.gate_proj, mlp.up_proj, mlp.down_proj
        self.gelu = bool(getattr(mlp, "gelu", False))

    @staticmethod
    def fusable(mlp: nn.Module) -> bool:
        g, u = getattr(mlp, "gate_proj", None), getattr(mlp, "up_proj", None)
        return (
            isinstance(g, QuantLinear)
            and isinstance(u, QuantLinear)
            and g.bias is None
            and u.bias is None
            and g.shape == u.shape
            and g.gemm_dtype == u.gemm_dtype
            and g.gemm_dtype in (torch.float32, torch.bfloat16, torch.int8)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g, u = self.gate_proj, self.up_proj
        if x.numel() >= g.gemm_min_rows * x.shape[-1]:
            h = torch.ops.opscope.qglu(
                x.float(), g.qs, g.d, g.m, g.qtype, u.qs, u.d, u.m, u.qtype, int(self.gelu), g.gemm_dtype
            ).to(x.dtype)
        else:
            gx = g(x)
            h = (F.gelu(gx, approximate="tanh") if self.gelu else F.silu(gx)) * u(x)
        return self.down_proj(h)


def qkv_fusable(attn: nn.Module) -> bool:
    """Whether an attention layer's q, k and v projections can run as one int8 op at prefill."""
    ps = [getattr(attn, n, None) for n in ("q_proj", "k_proj", "v_proj")]
    quant = [p for p in ps if isinstance(p, QuantLinear) and p.gemm_dtype == torch.int8]
    return len(quant) == 3 and len({p.gemm_min_rows for p in quant}) == 1


def project_qkv(attn: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """q, k and v of x (an Attention's ``project`` hook): a prompt's rows as one op, x quantized to
    int8 once and the three weights' panels in one parallel region (``opscope::qgemms_int8``); fewer
    rows run the projections one by one."""
    ps = (attn.q_proj, attn.k_proj, attn.v_proj)
    if x.numel() < ps[0].gemm_min_rows * x.shape[-1]:
        return tuple(p(x) for p in ps)
    ys = torch.ops.opscope.qgemms_int8(
        x.float(), [p.qs for p in ps], [p.d for p in ps], [p.m for p in ps], [p.qtype for p in ps]
    )
    return tuple((y if p.bias is None else y + p.bias).to(x.dtype) for y, p in zip(ys, ps, strict=True))


def install_prefill_kernels(model: nn.Module, enabled: bool = True) -> None:
    """Give the model's norms and attention layers the fused float32 kernels (``enabled`` False takes
    them back: benchmarks' A/B): a one-pass RMSNorm (``opscope::rms_norm``), and at prefill RoPE, the
    KV-cache write and causal attention as one op (``opscope::prefill_attn``: no q/k/v transposes,
    no RoPE temporaries, its output already in o_proj's layout)."""
    from opscope.engine.models.transformer import Attention, RMSNorm

    for mod in model.modules():
        if isinstance(mod, RMSNorm):
            mod.fused = _rms_norm if enabled else None
        elif isinstance(mod, Attention):
            mod.prefill = _prefill_attn if enabled else None


# Plain functions rather than the op objects themselves: a module holding them still pickles.
def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.ops.opscope.rms_norm(x, weight, eps)


def _prefill_attn(q, k, v, cos, sin, cache_k, cache_v, start: int, scale: float) -> torch.Tensor:
    return torch.ops.opscope.prefill_attn(q, k, v, cos, sin, cache_k, cache_v, start, scale)


class QuantEmbedding(_Blocks):
    """nn.Embedding over quantized rows: a lookup dequantizes the rows it reads."""

    def __init__(self, packed: PackedWeight):
        super().__init__(packed)
        self.num_embeddings, self.embedding_dim = packed.shape

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return torch.ops.opscope.qembedding(idx, self.qs, self.d, self.m, self.qtype, self.embedding_dim)

    def spec(self) -> tuple:
        return self.packed.spec()

    @property
    def weight(self) -> torch.Tensor:
        """The table as a float32 [V, dim] tensor whose metadata is free (BlocksWeight)."""
        return BlocksWeight(self.packed)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {self.ggml_type}"
