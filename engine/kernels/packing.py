"""GGUF quantized blocks → the structure-of-arrays layout the kernels read, plus a reference dequantizer.

A GGUF Q4_1 block is 20 bytes (fp16 d, fp16 m, 16 bytes of nibbles for 32 weights); Q8_0 is 34
bytes (fp16 d, 32 int8). Rows hold K/32 blocks one after another. Repacking once at load puts each
row's quants contiguous and its scales in separate fp16 arrays: the same bytes, but one 16-byte
load now feeds a SIMD register and the scales are read as a stream.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.errors import UnsupportedModelError

QK = 32
QTYPES = {"Q4_1": 0, "Q8_0": 1}
_BLOCK_BYTES = {"Q4_1": 20, "Q8_0": 34}


@dataclass(frozen=True)
class PackedWeight:
    """One weight matrix [N, K] in packed form (torch tensors, CPU)."""

    ggml_type: str  # "Q4_1" | "Q8_0"
    qs: object  # torch.uint8 [N, K/2] (Q4_1) or torch.int8 [N, K] (Q8_0)
    d: object  # torch.float16 [N, K/32]
    m: object | None  # torch.float16 [N, K/32] (Q4_1 only)
    shape: tuple[int, int]  # (N, K), logical

    @property
    def qtype(self) -> int:
        return QTYPES[self.ggml_type]

    @property
    def nbytes(self) -> int:
        extra = self.m.numel() * 2 if self.m is not None else 0
        return self.qs.numel() * self.qs.element_size() + self.d.numel() * 2 + extra


def supported(ggml_type: str) -> bool:
    return ggml_type in QTYPES


def pack(ggml_type: str, raw: np.ndarray, shape: tuple[int, int], row_order: np.ndarray | None = None
         ) -> PackedWeight:
    """Repack raw GGUF blocks ``raw`` (uint8, one row of blocks per output row) for logical ``shape``
    (N, K). ``row_order`` permutes output rows (e.g. GGUF's Q/K rope permutation undone)."""
    import torch

    if ggml_type not in QTYPES:
        raise UnsupportedModelError(f"the fast path has no kernel for {ggml_type} (has: {', '.join(QTYPES)})")
    n, k = shape
    if k % QK:
        raise UnsupportedModelError(f"{ggml_type} weight of shape {shape}: K must be a multiple of {QK}")
    blocks = np.ascontiguousarray(raw).reshape(n, k // QK, _BLOCK_BYTES[ggml_type])
    if row_order is not None:
        blocks = blocks[np.asarray(row_order)]
    d = torch.from_numpy(np.ascontiguousarray(blocks[:, :, 0:2]).view(np.float16).reshape(n, k // QK))
    if ggml_type == "Q4_1":
        m = torch.from_numpy(np.ascontiguousarray(blocks[:, :, 2:4]).view(np.float16).reshape(n, k // QK))
        qs = torch.from_numpy(np.ascontiguousarray(blocks[:, :, 4:]).reshape(n, k // 2))
        return PackedWeight(ggml_type, qs, d, m, (n, k))
    qs = torch.from_numpy(np.ascontiguousarray(blocks[:, :, 2:]).view(np.int8).reshape(n, k))
    return PackedWeight(ggml_type, qs, d, None, (n, k))


def dequantize_reference(w: PackedWeight):
    """Dense float32 [N, K] in plain torch: the portable reference the kernels are tested against."""
    import torch

    n, k = w.shape
    d = w.d.float().reshape(n, k // QK, 1)
    if w.ggml_type == "Q4_1":
        q = w.qs.reshape(n, k // QK, 16)
        vals = torch.cat([q & 0x0F, q >> 4], dim=-1).float()  # low nibbles are 0..15, high 16..31
        return (vals * d + w.m.float().reshape(n, k // QK, 1)).reshape(n, k)
    return (w.qs.reshape(n, k // QK, QK).float() * d).reshape(n, k)


def random_blocks(ggml_type: str, n: int, k: int, rng: "np.random.Generator") -> np.ndarray:
    """Raw GGUF rows of random blocks, [n, bytes per row] uint8: synthetic weights for tests and
    benchmarks (scales in the range real models use)."""
    nb = k // 32
    d = rng.uniform(0.002, 0.05, (n, nb, 1)).astype(np.float16).view(np.uint8)
    if ggml_type == "Q4_1":
        m = rng.uniform(-0.4, 0.1, (n, nb, 1)).astype(np.float16).view(np.uint8)
        qs = rng.integers(0, 256, (n, nb, 16), dtype=np.uint8)
        return np.concatenate([d, m, qs], axis=-1).reshape(n, nb * 20)
    qs = rng.integers(-127, 128, (n, nb, 32), dtype=np.int8).view(np.uint8)
    return np.concatenate([d, qs], axis=-1).reshape(n, nb * 34)
