"""Weight-only quantization of the plain torch model's linears (gpt-fast's scheme), for the GPU path.

Batch-1 decode reads every weight once per token, so it is bound by weight bytes: int8 halves them
against bf16, int4 quarters them. Activations keep the model's dtype; only the weights are stored
quantized and converted inside the matmul:

- ``int8``: symmetric, one scale per output channel. ``F.linear(x, w.to(x.dtype)) * scale``; under
  ``--compile decode`` Inductor fuses the conversion into the matmul (no dense copy per step).
- ``int4``: asymmetric, groups of 32 weights along K (scale + zero per group), packed for
  torch's tinygemm kernel (``aten._weight_int4pack_mm`` on CUDA, ``..._for_cpu`` on the CPU).

The model's own dense weights (a GGUF is dequantized at load) are re-quantized, so int4 adds its own
rounding to a 4-bit GGUF's. The CPU's default path for a GGUF is the fast path (engine.fastpath),
which keeps the file's own blocks instead.
"""

from __future__ import annotations

import logging

import torch
import torch.nn as nn
import torch.nn.functional as F
from opscope.engine.core.errors import ConfigError

log = logging.getLogger(__name__)

WOQ_MODES = ("off", "int8", "int4")
# Smallest group first: 32 is a Q4_1/Q4_0 GGUF's own block, so re-quantizing its dequantized weights
# is close to lossless (measured on the default model: mean KL 0.41 with groups of 64).
_INT4_GROUPS = (32, 64, 128)
_INNER_K_TILES = 2


class Int8Linear(nn.Module):
    """y = (x @ q^T) * scale (+ bias), q int8 [N, K], scale [N] in the activation dtype."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        w = linear.weight.detach().float()
        scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127
        self.register_buffer("weight", torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8))
        self.register_buffer("scales", scale.to(linear.weight.dtype))
        self.bias = linear.bias
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight.to(x.dtype)) * self.scales.to(x.dtype)
        return y + self.bias if self.bias is not None else y

    def dequantized(self) -> torch.Tensor:
        return self.weight.float() * self.scales.float()[:, None]


class Int4Linear(nn.Module):
    """tinygemm int4: q in 0..15, w = (q - 8) * scale + zero per group of ``group`` along K."""

    def __init__(self, linear: nn.Linear, group: int):
        super().__init__()
        w = linear.weight.detach().float()
        N, K = w.shape
        wg = w.reshape(-1, group)
        lo, hi = wg.amin(dim=1, keepdim=True), wg.amax(dim=1, keepdim=True)
        scale = (hi - lo).clamp(min=1e-6) / 15
        zero = lo + scale * 8
        q = ((wg - lo) / scale).round().clamp(0, 15).to(torch.int32).reshape(N, K)
        sz_dtype = torch.bfloat16 if w.device.type == "cuda" else linear.weight.dtype
        sz = torch.cat([scale.reshape(N, -1, 1), zero.reshape(N, -1, 1)], 2).transpose(0, 1).contiguous()
        self.register_buffer("packed", _pack_int4(q))
        self.register_buffer("scales_and_zeros", sz.to(sz_dtype))
        self.bias, self.group = linear.bias, group
        self.in_features, self.out_features = K, N

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if x.is_cuda:  # tinygemm takes bf16 activations only
            y = torch.ops.aten._weight_int4pack_mm(
                x2.to(torch.bfloat16), self.packed, self.group, self.scales_and_zeros
            ).to(x.dtype)
        else:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(
                x2, self.packed, self.group, self.scales_and_zeros.to(x.dtype)
            )
        y = y.reshape(*shape[:-1], self.out_features)
        return y + self.bias if self.bias is not None else y


def _pack_int4(q: torch.Tensor) -> torch.Tensor:
    if q.is_cuda:  # torch >= 2.5 packs two 4-bit values per byte, even index in the high nibble
        return torch.ops.aten._convert_weight_to_int4pack((q[:, ::2] << 4 | q[:, 1::2]).to(torch.uint8), _INNER_K_TILES)
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, _INNER_K_TILES)


def int4_group(K: int, N: int) -> int | None:
    """The smallest tinygemm group size that fits the shape, or None when int4 cannot take it."""
    if N % 8 or K % (_INNER_K_TILES * 16):
        return None
    return next((g for g in _INT4_GROUPS if K % g == 0), None)


def quantize_weights(model: nn.Module, mode: str) -> nn.Module:
    """Replaces the transformer layers' linears (not the output head: tied to the embedding in small
    models, and the most sensitive) with int8/int4 weight-only versions, in place."""
    if mode not in WOQ_MODES:
        raise ConfigError(f"--quantize {mode!r} is not one of {', '.join(WOQ_MODES)}")
    if mode == "off":
        return model
    kept = []
    for name, mod in list(model.named_modules()):
        if not name.startswith("layers.") or not isinstance(mod, nn.Linear):
            continue
        if mode == "int8":
            new = Int8Linear(mod)
        elif (group := int4_group(mod.in_features, mod.out_features)) is not None:
            new = Int4Linear(mod, group)
        else:
            kept.append(name)
            continue
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent), child, new)
    if kept:
        log.warning("int4: %d linears kept dense (shape not supported by tinygemm), e.g. %s", len(kept), kept[0])
    return model
