"""The Llama family (Llama 2/3, SmolLM2, Mistral, Qwen2) in mlx.nn, module for module the same as
engine.models.llama so that weights, traces and reports use one set of names.

Shapes: B batch, T new positions, S cached positions, H query heads, K key/value heads, D head dim,
C model dim, V vocabulary.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn


@dataclass(frozen=True)
class MLXModelArgs:
    """The subset of engine.models ModelConfig this model needs, plus the RoPE layout."""

    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    hidden_dim: int
    vocab_size: int
    norm_eps: float
    rope_theta: float
    max_seq_len: int
    tie_embeddings: bool
    qkv_bias: bool
    # GGUF stores Q/K rows permuted for the interleaved ("traditional") rotary layout; HF
    # checkpoints use rotate-half. Picking the matching RoPE avoids un-permuting weights.
    rope_traditional: bool = False
    rope_scaling: object | None = None  # engine.models RopeScaling, or None
    rope_freq_factors: tuple[float, ...] | None = None  # GGUF rope_freqs (Llama 3.1 scaling baked in)

    @classmethod
    def from_config(cls, cfg, rope_traditional: bool, tie_embeddings: bool,
                    rope_freq_factors: tuple[float, ...] | None = None) -> "MLXModelArgs":
        return cls(dim=cfg.dim, n_layers=cfg.n_layers, n_heads=cfg.n_heads, n_kv_heads=cfg.n_kv_heads,
                   head_dim=cfg.head_dim, hidden_dim=cfg.hidden_dim, vocab_size=cfg.vocab_size,
                   norm_eps=cfg.norm_eps, rope_theta=cfg.rope_theta, max_seq_len=cfg.max_seq_len,
                   tie_embeddings=tie_embeddings, qkv_bias=cfg.qkv_bias,
                   rope_traditional=rope_traditional, rope_scaling=cfg.rope_scaling,
                   rope_freq_factors=rope_freq_factors)


def rope_freqs(args: MLXModelArgs) -> mx.array | None:
    """Rotation wavelength divisors for ``mx.fast.rope(freqs=...)`` (angle = position / freqs), or
    None when plain RoPE applies (then ``base`` derives them). Same rules as engine.models.llama:
    GGUF ``rope_freqs`` factors win, else Llama 3 scaling; linear scaling is ``RoPE.scale``."""
    d, scaling = args.head_dim, args.rope_scaling
    inv = [args.rope_theta ** (-2 * i / d) for i in range(d // 2)]
    if args.rope_freq_factors is not None:
        inv = [f / k for f, k in zip(inv, args.rope_freq_factors)]
    elif scaling is not None and scaling.kind == "llama3":
        inv = [_llama3(f, scaling) for f in inv]
    else:
        return None
    return mx.array([1.0 / f for f in inv], dtype=mx.float32)


def _llama3(inv_freq: float, s) -> float:
    # long wavelengths scaled by factor, short ones kept, a smooth blend between
    wavelen = 2 * math.pi / inv_freq
    if wavelen < s.original_max_position / s.high_freq_factor:
        return inv_freq
    if wavelen > s.original_max_position / s.low_freq_factor:
        return inv_freq / s.factor
    smooth = (s.original_max_position / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    return (1 - smooth) * inv_freq / s.factor + smooth * inv_freq


class RoPE(nn.Module):
    def __init__(self, args: MLXModelArgs):
        super().__init__()
        self.dims = args.head_dim
        self.traditional = args.rope_traditional
        linear = args.rope_scaling is not None and args.rope_scaling.kind == "linear"
        self.scale = 1.0 / args.rope_scaling.factor if linear and args.rope_freq_factors is None else 1.0
        self._freqs = rope_freqs(args)  # "_": a constant, not a parameter
        self.base = None if self._freqs is not None else args.rope_theta

    def __call__(self, x: mx.array, offset: int) -> mx.array:
        return mx.fast.rope(x, self.dims, traditional=self.traditional, base=self.base,
                            scale=self.scale, offset=offset, freqs=self._freqs)


class KVCache:
    """Keys and values of the positions seen so far, in buffers grown ``STEP`` positions at a time
    so that decode writes in place instead of concatenating every token."""

    STEP = 256

    def __init__(self):
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        self.offset = 0

    def update(self, k: mx.array, v: mx.array) -> tuple[mx.array, mx.array]:
        B, K, T, D = k.shape
        start, have = self.offset, 0 if self.keys is None else self.keys.shape[2]
        if start + T > have:
            grow = -(-(start + T) // self.STEP) * self.STEP - have  # capacity: a multiple of STEP
            new_k, new_v = mx.zeros((B, K, grow, D), k.dtype), mx.zeros((B, K, grow, D), v.dtype)
            if self.keys is None:
                self.keys, self.values = new_k, new_v
            else:
                self.keys = mx.concatenate([self.keys, new_k], axis=2)
                self.values = mx.concatenate([self.values, new_v], axis=2)
        self.offset += T
        self.keys[..., start:self.offset, :] = k
        self.values[..., start:self.offset, :] = v
        return self.keys[..., :self.offset, :], self.values[..., :self.offset, :]  # [B, K, S, D]

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None else self.keys.nbytes + self.values.nbytes


class Attention(nn.Module):
    def __init__(self, args: MLXModelArgs):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = args.n_heads, args.n_kv_heads, args.head_dim
        self.scale = args.head_dim ** -0.5
        self.q_proj = nn.Linear(args.dim, args.n_heads * args.head_dim, bias=args.qkv_bias)
        self.k_proj = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=args.qkv_bias)
        self.v_proj = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=args.qkv_bias)
        self.o_proj = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=False)
        self.rope = RoPE(args)

    def __call__(self, x: mx.array, cache: KVCache) -> mx.array:
        B, T, _ = x.shape
        q = self.q_proj(x).reshape(B, T, self.n_heads, -1).transpose(0, 2, 1, 3)  # [B, H, T, D]
        k = self.k_proj(x).reshape(B, T, self.n_kv_heads, -1).transpose(0, 2, 1, 3)  # [B, K, T, D]
        v = self.v_proj(x).reshape(B, T, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        q = self.rope(q, offset=cache.offset)
        k = self.rope(k, offset=cache.offset)
        k, v = cache.update(k, v)  # [B, K, S, D]
        # "causal" aligns the last query with the last key, which is right with a cache prefix.
        o = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.scale,
                                                 mask="causal" if T > 1 else None)  # [B, H, T, D]
        return self.o_proj(o.transpose(0, 2, 1, 3).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, args: MLXModelArgs):
        super().__init__()
        self.gate_proj = nn.Linear(args.dim, args.hidden_dim, bias=False)
        self.up_proj = nn.Linear(args.dim, args.hidden_dim, bias=False)
        self.down_proj = nn.Linear(args.hidden_dim, args.dim, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, args: MLXModelArgs):
        super().__init__()
        self.attn_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.attn = Attention(args)
        self.mlp_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.mlp = MLP(args)

    def __call__(self, x: mx.array, cache: KVCache) -> mx.array:
        h = x + self.attn(self.attn_norm(x), cache)
        return h + self.mlp(self.mlp_norm(h))


class Transformer(nn.Module):
    """forward(idx [B, T] int32, caches) -> logits [B, T, V] ([B, 1, V] with ``last_only``);
    the caches advance by T."""

    def __init__(self, args: MLXModelArgs):
        super().__init__()
        self.args = args
        self.embed = nn.Embedding(args.vocab_size, args.dim)
        self.layers = [Block(args) for _ in range(args.n_layers)]
        self.norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        if not args.tie_embeddings:
            self.lm_head = nn.Linear(args.dim, args.vocab_size, bias=False)

    def __call__(self, idx: mx.array, caches: list[KVCache], last_only: bool = False) -> mx.array:
        h = self.embed(idx)  # [B, T, C]
        for layer, cache in zip(self.layers, caches):
            h = layer(h, cache)
        if last_only:
            h = h[:, -1:, :]  # prefill needs only the last position's logits
        h = self.norm(h)
        if self.args.tie_embeddings:
            return self.embed.as_linear(h)  # [B, T, V]
        return self.lm_head(h)

    def new_caches(self) -> list[KVCache]:
        return [KVCache() for _ in self.layers]
