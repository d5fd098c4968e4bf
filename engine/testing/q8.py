"""The int8 activations of ``activations=q8`` (llama.cpp's q8 schemes) as a float64 model: the
reference the int8 kernels are checked against, on every instruction set. Per ``block`` values one
float32 scale amax/127; the values times the scale's float32 inverse, rounded to nearest even."""

from __future__ import annotations

import numpy as np


def quantize(x: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """int8 values (x's shape) and float32 scales (x's shape with the last axis / ``block``)."""
    xb = np.asarray(x).reshape(*x.shape[:-1], -1, block).astype(np.float32)
    scale = (np.abs(xb).max(-1) / np.float32(127)).astype(np.float32)
    inv = np.where(scale > 0, np.float32(1) / np.where(scale > 0, scale, 1), 0).astype(np.float32)
    q = np.rint(xb * inv[..., None])
    assert np.abs(q).max(initial=0) <= 127
    return q.astype(np.int8).reshape(x.shape), scale


def dequantized(x: np.ndarray, block: int) -> np.ndarray:
    """x as the int8 kernels see it, in float64."""
    q, scale = quantize(x, block)
    return (q.reshape(*x.shape[:-1], -1, block) * scale[..., None].astype(np.float64)).reshape(x.shape)
