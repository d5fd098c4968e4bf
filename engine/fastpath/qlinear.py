"""QuantLinear: an nn.Linear replacement fed from the GGUF's quantized blocks.

Decode (few rows) runs the fused dequantize-matvec kernel; prefill (``gemm_min_rows`` rows or more)
dequantizes the weight to bf16/fp32 and runs torch's GEMM. Both are one dispatcher op,
``torch.ops.opscope.qlinear``, which torch.compile treats as an opaque call.
"""
from __future__ import annotations

import threading

import torch
import torch.nn as nn

from engine.kernels import PackedWeight, dequantize_reference, load_kernels

_GEMM_DTYPES = {"bf16": torch.bfloat16, "f32": torch.float32}
_fake_lock = threading.Lock()
_fake_registered = False


def ensure_op() -> None:
    """Load the kernels (registering the op) and its fake kernel for torch.compile, once."""
    global _fake_registered
    load_kernels()
    with _fake_lock:
        if _fake_registered:
            return

        @torch.library.register_fake("opscope::qlinear")
        def _fake(x, qs, d, m, qtype, act_mode, gemm_min_rows, gemm_dtype):
            return x.new_empty((*x.shape[:-1], d.shape[0]))

        _fake_registered = True


class QuantLinear(nn.Module):
    """y = x @ W^T (+ bias) with W kept as packed Q4_1/Q8_0 blocks (engine.kernels.PackedWeight)."""

    def __init__(self, packed: PackedWeight, bias: torch.Tensor | None = None, *, act_mode: int = 0,
                 gemm_min_rows: int = 8, gemm_dtype: str = "bf16"):
        super().__init__()
        self.out_features, self.in_features = packed.shape
        self.ggml_type, self.qtype = packed.ggml_type, packed.qtype
        self.act_mode, self.gemm_min_rows = act_mode, gemm_min_rows
        self.gemm_dtype = _GEMM_DTYPES[gemm_dtype]
        self.register_buffer("qs", packed.qs, persistent=False)
        self.register_buffer("d", packed.d, persistent=False)
        self.register_buffer("m", packed.m, persistent=False)
        self.bias = bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype  # the kernels take float32; a bf16/fp16 model gets its own dtype back
        y = torch.ops.opscope.qlinear(x.float(), self.qs, self.d, self.m, self.qtype, self.act_mode,
                                      self.gemm_min_rows, self.gemm_dtype)
        if self.bias is not None:
            y = y + self.bias
        return y.to(dtype)

    @property
    def weight(self) -> torch.Tensor:
        """Dense float32 weight, computed on demand (code that inspects .weight, tests)."""
        return dequantize_reference(PackedWeight(self.ggml_type, self.qs, self.d, self.m,
                                                 (self.out_features, self.in_features)))

    @property
    def weight_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.qs, self.d, self.m) if t is not None)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, {self.ggml_type}, "
                f"act_mode={self.act_mode}, gemm_min_rows={self.gemm_min_rows}, gemm_dtype={self.gemm_dtype}")
