"""GGUF quantized blocks → the weight layouts the kernels read, plus a reference dequantizer.

Two layouts:
  * Q4_1 and Q8_0 are repacked once at load into structure-of-arrays per row (quants contiguous,
    fp16 scales in separate arrays): the same bytes, but one 16-byte load feeds a SIMD register and
    the scales are read as a stream; tuned kernels (and int8 activations) read this layout. Q4_0
    joins them as Q4_1 with m = -8·d (exact in fp16: the same weights, bit for bit), which the
    tuned kernel runs faster than the generic one decodes Q4_0 (measured about 1.7x per weight).
  * Every other supported type stays in its GGUF blocks as stored ("raw"): a [N, bytes per row]
    uint8 tensor, a view of the memory-mapped file where rows need no reordering. The generic
    kernels (csrc/raw.cpp) decode the blocks per type (csrc/gguf_types.h).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from opscope.engine.core.errors import UnsupportedModelError

if TYPE_CHECKING:
    import torch

QK = 32
QTYPES = {"Q4_1": 0, "Q8_0": 1}  # the structure-of-arrays layouts
_BLOCK_BYTES = {"Q4_1": 20, "Q8_0": 34}
QTYPE_RAW = 16  # qtype of raw blocks: QTYPE_RAW + the ggml type id (csrc/qkernels.h)
# The C++ DecodeModel's qtype for Q4_0 held as Q4_1 (m = -8 d exactly): its kernels take the offset
# from d and skip reading m, a tenth of the bytes per weight (csrc/qkernels.h QTYPE_Q4_0_SOA).
QTYPE_Q4_0_SOA = 2
# ggml type id, weights per block, bytes per block of the types the generic kernels decode
RAW_TYPES = {
    "F32": (0, 16, 64),
    "F16": (1, 16, 32),
    "BF16": (30, 16, 32),
    "Q4_0": (2, 32, 18),
    "Q4_1": (3, 32, 20),
    "Q5_0": (6, 32, 22),
    "Q5_1": (7, 32, 24),
    "Q8_0": (8, 32, 34),
    "Q2_K": (10, 256, 84),
    "Q3_K": (11, 256, 110),
    "Q4_K": (12, 256, 144),
    "Q5_K": (13, 256, 176),
    "Q6_K": (14, 256, 210),
    "IQ4_NL": (20, 32, 18),
    "IQ4_XS": (23, 256, 136),
}
LAYOUTS = ("auto", "raw")


@dataclass(frozen=True)
class PackedWeight:
    """One weight matrix [N, K] in a kernel layout (torch tensors, CPU): structure-of-arrays
    (``d`` set) or raw GGUF blocks (``qs`` [N, bytes per row] uint8, ``d`` and ``m`` None)."""

    ggml_type: str
    qs: torch.Tensor  # SoA: torch.uint8 [N, K/2] (Q4_1) or torch.int8 [N, K] (Q8_0); raw: torch.uint8 [N, row bytes]
    d: torch.Tensor | None  # SoA: torch.float16 [N, K/32]
    m: torch.Tensor | None  # SoA: torch.float16 [N, K/32] (Q4_1 only)
    shape: tuple[int, int]  # (N, K), logical

    @property
    def raw(self) -> bool:
        return self.d is None

    @property
    def qtype(self) -> int:
        if self.raw:
            return QTYPE_RAW + RAW_TYPES[self.ggml_type][0]
        return QTYPES["Q4_1"] if self.m is not None else QTYPES["Q8_0"]  # Q4_0 is held as Q4_1

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.qs, self.d, self.m) if t is not None)

    def spec(self, bias=None) -> tuple:
        """(qtype, qs, d, m, bias): the C++ DecodeModel's form of a matrix (Q4_0 held as Q4_1:
        QTYPE_Q4_0_SOA, the same tensors)."""
        q4_0_soa = self.ggml_type == "Q4_0" and not self.raw
        return (QTYPE_Q4_0_SOA if q4_0_soa else self.qtype, self.qs, self.d, self.m, bias)


def supported(ggml_type: str, k: int | None = None) -> bool:
    """Whether the kernels read ``ggml_type`` (with rows of ``k`` weights, when given)."""
    if ggml_type not in RAW_TYPES:
        return False
    return k is None or k % RAW_TYPES[ggml_type][1] == 0


def row_bytes(ggml_type: str, k: int) -> int:
    _, qk, nbytes = RAW_TYPES[ggml_type]
    return k // qk * nbytes


def pack(
    ggml_type: str, raw: np.ndarray, shape: tuple[int, int], row_order: np.ndarray | None = None, layout: str = "auto"
) -> PackedWeight:
    """Raw GGUF blocks ``raw`` (uint8, one row of blocks per output row) for logical ``shape`` (N, K)
    in the kernels' layout: Q4_1/Q8_0 repacked to structure-of-arrays (``layout="auto"``), every
    other type (or any with ``layout="raw"``) kept as stored: a view of ``raw`` when it is
    contiguous and ``row_order`` is None. ``row_order`` permutes output rows (GGUF's Q/K rope
    permutation undone)."""
    if not supported(ggml_type):
        raise UnsupportedModelError(f"the fast path has no kernel for {ggml_type} (has: {', '.join(RAW_TYPES)})")
    n, k = shape
    if not supported(ggml_type, k):
        raise UnsupportedModelError(
            f"{ggml_type} weight of shape {shape}: K must be a multiple of {RAW_TYPES[ggml_type][1]}"
        )
    if layout == "auto" and ggml_type == "Q4_0":
        as_q4_1 = _q4_0_as_q4_1(raw, shape)
        if as_q4_1 is not None:
            w = _soa("Q4_1", as_q4_1, shape, row_order)
            return PackedWeight("Q4_0", w.qs, w.d, w.m, w.shape)
    if layout == "raw" or ggml_type not in QTYPES:
        return _raw(ggml_type, raw, shape, row_order)
    return _soa(ggml_type, raw, shape, row_order)


def _q4_0_as_q4_1(raw: np.ndarray, shape: tuple[int, int]) -> np.ndarray | None:
    """Q4_0 blocks (d, nibbles; w = d*(q-8)) rewritten as Q4_1 (d, m = -8d, nibbles; w = d*q + m):
    d*q is exact in float32, so the weights are identical. None when some -8d overflows fp16."""
    n, k = shape
    blocks = np.ascontiguousarray(raw).reshape(n, k // QK, 18)
    d = blocks[:, :, 0:2].copy().view(np.float16)
    with np.errstate(over="ignore"):
        m = (d.astype(np.float32) * np.float32(-8)).astype(np.float16)
    if not np.isfinite(m).all() or not np.array_equal(m.astype(np.float32), d.astype(np.float32) * np.float32(-8)):
        return None
    return np.concatenate([d.view(np.uint8), m.view(np.uint8), blocks[:, :, 2:]], axis=-1).reshape(n, k // QK * 20)


def _raw(ggml_type: str, raw: np.ndarray, shape: tuple[int, int], row_order) -> PackedWeight:
    import torch

    n, k = shape
    rows = np.asarray(raw).reshape(n, row_bytes(ggml_type, k))
    if row_order is not None:
        rows = rows[np.asarray(row_order)]  # a copy: only Q/K rows that need the rope permutation
    rows = np.ascontiguousarray(rows)
    with warnings.catch_warnings():  # a read-only view of the mapped file; the kernels never write it
        warnings.simplefilter("ignore", UserWarning)
        qs = torch.from_numpy(rows)
    return PackedWeight(ggml_type, qs, None, None, (n, k))


def _soa(ggml_type: str, raw: np.ndarray, shape: tuple[int, int], row_order) -> PackedWeight:
    import torch

    n, k = shape
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
    """Dense float32 [N, K] without the kernels: the reference the kernels are tested against
    (plain torch for the SoA layouts, the gguf package's numpy decoders for raw blocks)."""
    import torch

    n, k = w.shape
    if w.raw:
        import gguf

        dense = gguf.quants.dequantize(w.qs.numpy(), gguf.GGMLQuantizationType[w.ggml_type])
        return torch.from_numpy(np.ascontiguousarray(dense, dtype=np.float32).reshape(n, k))
    assert w.d is not None  # every SoA layout carries its scales
    d = w.d.float().reshape(n, k // QK, 1)
    if w.m is not None:  # Q4_1 (and Q4_0 held as Q4_1)
        q = w.qs.reshape(n, k // QK, 16)
        vals = torch.cat([q & 0x0F, q >> 4], dim=-1).float()  # low nibbles are 0..15, high 16..31
        return (vals * d + w.m.float().reshape(n, k // QK, 1)).reshape(n, k)
    return (w.qs.reshape(n, k // QK, QK).float() * d).reshape(n, k)


def _fp16(rng, lo: float, hi: float, shape) -> np.ndarray:
    return rng.uniform(lo, hi, (*shape, 1)).astype(np.float16).view(np.uint8)


def random_blocks(ggml_type: str, n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """Raw GGUF rows of random blocks, [n, bytes per row] uint8: synthetic weights for tests and
    benchmarks. Quant bytes are uniform random (every bit pattern is a valid quant); fp16 scales
    are in the range real models use, so weights are of order 0.01-0.1."""
    _, qk, nbytes = RAW_TYPES[ggml_type]
    nb = k // qk
    if ggml_type in ("F32", "F16", "BF16"):
        x = rng.normal(0, 0.05, (n, k)).astype(np.float32)
        if ggml_type == "F32":
            return x.view(np.uint8).reshape(n, k * 4)
        if ggml_type == "F16":
            return x.astype(np.float16).view(np.uint8).reshape(n, k * 2)
        return (x.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(n, k * 2)
    blocks = rng.integers(0, 256, (n, nb, nbytes), dtype=np.uint8)
    s = (n, nb)
    if ggml_type in ("Q4_0", "Q5_0", "Q8_0", "IQ4_NL", "IQ4_XS"):  # fp16 d first
        lo_hi = {"Q8_0": (0.0002, 0.001), "IQ4_NL": (0.0002, 0.001), "IQ4_XS": (0.00001, 0.00005)}
        blocks[:, :, 0:2] = _fp16(rng, *lo_hi.get(ggml_type, (0.002, 0.01)), s)
    elif ggml_type in ("Q4_1", "Q5_1"):  # fp16 d, fp16 m
        blocks[:, :, 0:2] = _fp16(rng, 0.002, 0.01, s)
        blocks[:, :, 2:4] = _fp16(rng, -0.1, 0.0, s)
    elif ggml_type in ("Q4_K", "Q5_K"):  # fp16 d, fp16 dmin, six-bit scales/mins
        blocks[:, :, 0:2] = _fp16(rng, 0.00005, 0.0002, s)
        blocks[:, :, 2:4] = _fp16(rng, 0.0001, 0.0005, s)
    elif ggml_type == "Q2_K":  # scales[16], qs[64], fp16 d, fp16 dmin
        blocks[:, :, 80:82] = _fp16(rng, 0.001, 0.005, s)
        blocks[:, :, 82:84] = _fp16(rng, 0.0005, 0.003, s)
    elif ggml_type == "Q3_K":  # hmask, qs, scales[12], fp16 d
        blocks[:, :, 108:110] = _fp16(rng, 0.0002, 0.001, s)
    elif ggml_type == "Q6_K":  # ql, qh, int8 scales[16], fp16 d
        blocks[:, :, 208:210] = _fp16(rng, 0.00001, 0.00005, s)
    return blocks.reshape(n, nb * nbytes)
