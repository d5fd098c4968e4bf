"""GGUF tensors → MLX arrays, one tensor at a time, for every type the torch backend reads.

MLX's quantized layers hold affine groups: ``w = scale · q + bias`` with q packed into uint32 words.
- Q4_0, Q4_1 and Q8_0 blocks *are* such groups (32 values, one scale, an offset), and so are Q4_K's
  32-value sub-blocks (scale d·sc, offset −dmin·m): their bits are repacked as they are ("exact"),
  with the scales and offsets kept in float32.
  Q5_0, Q5_1 and Q5_K's 32-value sub-blocks are affine too, with 5-bit values: repacked exactly
  into 8-bit groups.
- Q2_K, Q3_K, Q6_K (16-value sub-blocks) and IQ4_NL/IQ4_XS (non-uniform levels) have no MLX form:
  they are dequantized by the ggml project's ``gguf.quants`` and ``mx.quantize``d to 8-bit groups
  of ``GROUP`` values ("requantized"; the error this adds is measured in
  benchmarks/mlx_precision.py).
- F32, F16 and BF16 stay dense.

Whatever the type, ``mx.load`` never sees the file: it reads only F16/F32/Q4_0/Q4_1/Q8_0 and stops at
the first other tensor, where almost every downloaded file is a K-quant mix.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GROUP = 32  # every GGUF type's (sub-)blocks are 32 values or a divisor of 32 (Q3_K/Q6_K: 16)
FLOAT_TYPES = ("F32", "F16", "BF16")
# blocks (or 32-value sub-blocks) already in MLX's affine form; 5-bit values sit in 8-bit groups
EXACT = {"Q4_0": 4, "Q4_1": 4, "Q8_0": 8, "Q4_K": 4, "Q5_0": 8, "Q5_1": 8, "Q5_K": 8}
# 16-value sub-blocks (MLX's smallest group is 32) and IQ4's non-uniform levels fit no MLX group
# exactly: 8 bits keep the added rounding within 1/255 of a group's range. Measured with 4 bits,
# IQ4_NL moved the default model's logits by a mean KL of 0.53 (benchmarks/mlx_precision.py).
REQUANT_BITS = {"Q2_K": 8, "Q3_K": 8, "IQ4_NL": 8, "IQ4_XS": 8, "Q6_K": 8}


@dataclass(frozen=True)
class Conversion:
    """How one GGUF type reaches MLX: ``kind`` is "dense", "exact" or "requantized"."""

    source: str
    kind: str
    bits: int = 0
    group_size: int = 0

    def describe(self) -> str:
        """'Q4_K → MLX 4-bit g32: requantized' (the load line and the status bar)."""
        if self.kind == "dense":
            return f"{self.source} → MLX dense"
        return f"{self.source} → MLX {self.bits}-bit g{self.group_size}: {self.kind}"


def conversion(type_name: str) -> Conversion:
    if type_name in FLOAT_TYPES:
        return Conversion(type_name, "dense")
    if type_name in EXACT:
        return Conversion(type_name, "exact", EXACT[type_name], 32)
    if type_name in REQUANT_BITS:
        return Conversion(type_name, "requantized", REQUANT_BITS[type_name], GROUP)
    raise KeyError(type_name)


def summary(types: dict[str, int]) -> list[str]:
    """One line per quantized type in the file, e.g. ['Q4_K → MLX 4-bit g32: requantized', ...]."""
    order = sorted(t for t in types if t not in FLOAT_TYPES)
    return [conversion(t).describe() for t in order]


def convert(type_name: str, raw: np.ndarray, shape: tuple[int, ...]) -> dict:
    """Raw GGUF blocks [rows, bytes] of logical ``shape`` → {"weight"} (dense, numpy float) or
    {"weight", "scales", "biases"} (MLX quantized arrays)."""
    import gguf

    conv = conversion(type_name)
    if conv.kind == "exact" and len(shape) == 2:
        return _EXACT_CONVERTERS[type_name](raw, shape)
    w = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[type_name]).reshape(shape)
    if conv.kind == "dense" or len(shape) != 2:
        return {"weight": w if type_name != "F32" else np.array(w, dtype=np.float32)}
    return _requantize(w, conv.bits)


def _requantize(w: np.ndarray, bits: int) -> dict:
    import mlx.core as mx

    q, scales, biases = mx.quantize(mx.array(w.astype(np.float32)), group_size=GROUP, bits=bits)
    mx.eval(q, scales, biases)
    return {"weight": q, "scales": scales, "biases": biases}


# -- the exact repacks --------------------------------------------------------------------------------
def _blocks(raw: np.ndarray, shape, nbytes: int, values: int = 32) -> np.ndarray:
    """[rows, bytes per row] → [rows, blocks per row, nbytes]."""
    return np.ascontiguousarray(raw).reshape(shape[0], shape[1] // values, nbytes)


def _f16(b: np.ndarray, at: int) -> np.ndarray:
    return b[..., at : at + 2].copy().view(np.float16)[..., 0].astype(np.float32)  # [rows, blocks]


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """ggml's 16 bytes of a 4-bit block → 32 values in order (low nibbles first, then high)."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)  # [rows, blocks, 32]


def _pack(q: np.ndarray, bits: int, shape) -> np.ndarray:
    """Values [rows, blocks, 32] → MLX's uint32 words [rows, in·bits/32], element i at bits
    ``bits·(i mod 32/bits)`` of word ``i // (32/bits)`` (little-endian)."""
    per = 32 // bits
    q = q.reshape(shape[0], -1, per).astype(np.uint32)
    shifts = np.arange(per, dtype=np.uint32) * bits
    return np.bitwise_or.reduce(q << shifts, axis=-1)


def _quantized(q: np.ndarray, bits: int, scales: np.ndarray, biases: np.ndarray, shape) -> dict:
    import mlx.core as mx

    return {"weight": mx.array(_pack(q, bits, shape)), "scales": mx.array(scales), "biases": mx.array(biases)}


def _q4_0(raw, shape) -> dict:  # block: d (f16), 16 bytes of nibbles; w = d·(q − 8)
    b = _blocks(raw, shape, 18)
    d = _f16(b, 0)
    return _quantized(_nibbles(b[..., 2:]), 4, d, -8.0 * d, shape)


def _q4_1(raw, shape) -> dict:  # block: d, m (f16), 16 bytes of nibbles; w = d·q + m
    b = _blocks(raw, shape, 20)
    return _quantized(_nibbles(b[..., 4:]), 4, _f16(b, 0), _f16(b, 2), shape)


def _q8_0(raw, shape) -> dict:  # block: d (f16), 32 int8; w = d·q = d·(q + 128) − 128·d
    b = _blocks(raw, shape, 34)
    d = _f16(b, 0)
    q = b[..., 2:].view(np.int8).astype(np.int16) + 128
    return _quantized(q, 8, d, -128.0 * d, shape)


def _q4_k(raw, shape) -> dict:
    """Super-block of 256: d, dmin (f16), 12 bytes of 6-bit sub-block scales and mins, 128 bytes of
    nibbles; sub-block j: w = d·sc_j·q − dmin·m_j (ggml's dequantize_row_q4_K)."""
    b = _blocks(raw, shape, 144, 256)
    d, dmin, sc, qs = _f16(b, 0), _f16(b, 2), b[..., 4:16].astype(np.uint8), b[..., 16:]
    scale, minimum = _k4_scales(sc)  # [rows, blocks, 8]
    chunks = qs.reshape(*qs.shape[:2], 4, 32)  # 64 values each: low nibbles, then high
    q = np.stack([chunks & 0x0F, chunks >> 4], axis=3).reshape(*qs.shape[:2], 8, 32)
    scales = (d[..., None] * scale).reshape(shape[0], -1)
    biases = (-dmin[..., None] * minimum).reshape(shape[0], -1)
    return _quantized(q, 4, scales.astype(np.float32), biases.astype(np.float32), shape)


def _k4_scales(sc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ggml's get_scale_min_k4 for all 8 sub-blocks: 6-bit scales and mins from 12 bytes."""
    lo, hi = sc[..., 0:4], sc[..., 4:8]  # sub-blocks 0..3: 6 low bits of bytes 0..3 / 4..7
    top = sc[..., 8:12]  # sub-blocks 4..7: 4 bits here, the top 2 bits in bytes 0..3 / 4..7
    scale = np.concatenate([lo & 63, (top & 0x0F) | ((lo >> 6) << 4)], axis=-1)
    minimum = np.concatenate([hi & 63, (top >> 4) | ((hi >> 6) << 4)], axis=-1)
    return scale.astype(np.float32), minimum.astype(np.float32)


def _fifth_bits(qh: np.ndarray) -> np.ndarray:
    """Q5_0/Q5_1's 4 bytes of high bits → bit j of the little-endian word, as [.., 32] values."""
    word = qh.copy().view("<u4")  # [rows, blocks, 1]
    return ((word >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)


def _q5_0(raw, shape) -> dict:  # block: d, qh (4 bytes), 16 bytes of nibbles; w = d·(q − 16)
    b = _blocks(raw, shape, 22)
    d = _f16(b, 0)
    q = _nibbles(b[..., 6:]) | (_fifth_bits(b[..., 2:6]) << 4)
    return _quantized(q, 8, d, -16.0 * d, shape)


def _q5_1(raw, shape) -> dict:  # block: d, m, qh (4 bytes), 16 bytes of nibbles; w = d·q + m
    b = _blocks(raw, shape, 24)
    q = _nibbles(b[..., 8:]) | (_fifth_bits(b[..., 4:8]) << 4)
    return _quantized(q, 8, _f16(b, 0), _f16(b, 2), shape)


def _q5_k(raw, shape) -> dict:
    """Super-block of 256: d, dmin, 12 bytes of 6-bit scales/mins, qh[32], qs[128]; sub-block j:
    w = d·sc_j·q − dmin·m_j, q = nibble + 16·(bit j of qh[l]) (ggml's dequantize_row_q5_K)."""
    b = _blocks(raw, shape, 176, 256)
    d, dmin, scale, minimum = _f16(b, 0), _f16(b, 2), *_k4_scales(b[..., 4:16].astype(np.uint8))
    qh, qs = b[..., 16:48], b[..., 48:]
    chunks = qs.reshape(*qs.shape[:2], 4, 32)
    low = np.stack([chunks & 0x0F, chunks >> 4], axis=3).reshape(*qs.shape[:2], 8, 32)
    high = (qh[..., None, :] >> np.arange(8, dtype=np.uint8)[:, None]) & 1  # [rows, blocks, 8, 32]
    q = low | (high << 4)
    scales = (d[..., None] * scale).reshape(shape[0], -1)
    biases = (-dmin[..., None] * minimum).reshape(shape[0], -1)
    return _quantized(q, 8, scales.astype(np.float32), biases.astype(np.float32), shape)


_EXACT_CONVERTERS = {
    "Q4_0": _q4_0,
    "Q4_1": _q4_1,
    "Q8_0": _q8_0,
    "Q4_K": _q4_k,
    "Q5_0": _q5_0,
    "Q5_1": _q5_1,
    "Q5_K": _q5_k,
}
