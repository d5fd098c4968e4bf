"""The engine's transformer (engine.models.transformer) in mlx.nn, module for module the same so that
weights, traces and reports use one set of names: the Llama core plus the switches of ModelConfig
that the families in engine.models.families set (QK-norm, post-norms, GeGLU, embedding scale,
query scale, soft-caps, sliding windows, a local RoPE base), so every family the torch backend runs
comes from the same descriptors.

Shapes: B batch, T new positions, S cached positions, H query heads, K key/value heads, D head dim,
C model dim, V vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import mlx.core as mx
import mlx.nn as nn


class RopeScalingLike(Protocol):
    """engine.models RopeScaling as this model reads it (a plugin sees only the engine's public API)."""

    kind: str  # "linear" | "llama3"
    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position: int


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
    rope_scaling: RopeScalingLike | None = None  # engine.models RopeScaling, or None
    rope_freq_factors: tuple[float, ...] | None = None  # GGUF rope_freqs (Llama 3.1 scaling baked in)
    # ModelConfig's family switches (engine.models.config; defaults: the plain Llama block)
    qk_norm: bool = False
    post_norms: bool = False
    mlp_act: str = "silu"
    embed_scale: float = 1.0
    attn_scale: float = 0.0
    attn_softcap: float = 0.0
    final_softcap: float = 0.0
    windows: tuple[int, ...] = ()  # per layer (0: global); () → none
    rope_local_theta: float = 0.0

    @classmethod
    def from_config(
        cls, cfg, rope_traditional: bool, tie_embeddings: bool, rope_freq_factors: tuple[float, ...] | None = None
    ) -> MLXModelArgs:
        return cls(
            dim=cfg.dim,
            n_layers=cfg.n_layers,
            n_heads=cfg.n_heads,
            n_kv_heads=cfg.n_kv_heads,
            head_dim=cfg.head_dim,
            hidden_dim=cfg.hidden_dim,
            vocab_size=cfg.vocab_size,
            norm_eps=cfg.norm_eps,
            rope_theta=cfg.rope_theta,
            max_seq_len=cfg.max_seq_len,
            tie_embeddings=tie_embeddings,
            qkv_bias=cfg.qkv_bias,
            rope_traditional=rope_traditional,
            rope_scaling=cfg.rope_scaling,
            rope_freq_factors=rope_freq_factors,
            qk_norm=cfg.qk_norm,
            post_norms=cfg.post_norms,
            mlp_act=cfg.mlp_act,
            embed_scale=cfg.embed_scale,
            attn_scale=cfg.attn_scale,
            attn_softcap=cfg.attn_softcap,
            final_softcap=cfg.final_softcap,
            windows=tuple(cfg.window(i) for i in range(cfg.n_layers)),
            rope_local_theta=cfg.rope_local_theta,
        )

    def window(self, layer: int) -> int:
        return self.windows[layer] if self.windows else 0

    def local_rope(self, layer: int) -> bool:
        """Whether ``layer`` rotates with the local, unscaled base (Gemma 3's windowed layers)."""
        return bool(self.rope_local_theta) and self.window(layer) > 0


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


def _llama3(inv_freq: float, s: RopeScalingLike) -> float:
    # long wavelengths scaled by factor, short ones kept, a smooth blend between
    wavelen = 2 * math.pi / inv_freq
    if wavelen < s.original_max_position / s.high_freq_factor:
        return inv_freq
    if wavelen > s.original_max_position / s.low_freq_factor:
        return inv_freq / s.factor
    smooth = (s.original_max_position / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    return (1 - smooth) * inv_freq / s.factor + smooth * inv_freq


class RoPE(nn.Module):
    def __init__(self, args: MLXModelArgs, local: bool = False):
        super().__init__()
        self.dims = args.head_dim
        self.traditional = args.rope_traditional
        self._freqs: mx.array | None  # "_": a constant, not a parameter
        self.base: float | None  # None: the freqs give the wavelengths
        if local:  # the windowed layers' own base, without the global scaling (Gemma 3)
            self.scale, self._freqs, self.base = 1.0, None, args.rope_local_theta
            return
        scaling = args.rope_scaling
        linear = scaling is not None and scaling.kind == "linear" and args.rope_freq_factors is None
        self.scale = 1.0 / scaling.factor if scaling is not None and linear else 1.0
        self._freqs = rope_freqs(args)
        self.base = None if self._freqs is not None else args.rope_theta

    def __call__(self, x: mx.array, offset: int) -> mx.array:
        return mx.fast.rope(
            x,
            self.dims,
            traditional=self.traditional,
            base=self.base,
            scale=self.scale,
            offset=offset,
            freqs=self._freqs,
        )


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
        start, keys, values = self.offset, self.keys, self.values
        have = 0 if keys is None else keys.shape[2]
        if keys is None or values is None or start + T > have:
            grow = -(-(start + T) // self.STEP) * self.STEP - have  # capacity: a multiple of STEP
            new_k, new_v = mx.zeros((B, K, grow, D), k.dtype), mx.zeros((B, K, grow, D), v.dtype)
            keys = new_k if keys is None else mx.concatenate([keys, new_k], axis=2)
            values = new_v if values is None else mx.concatenate([values, new_v], axis=2)
            self.keys, self.values = keys, values
        self.offset += T
        keys[..., start : self.offset, :] = k
        values[..., start : self.offset, :] = v
        return keys[..., : self.offset, :], values[..., : self.offset, :]  # [B, K, S, D]

    @property
    def nbytes(self) -> int:
        return 0 if self.keys is None or self.values is None else self.keys.nbytes + self.values.nbytes


class Attention(nn.Module):
    def __init__(self, args: MLXModelArgs, index: int = 0):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = args.n_heads, args.n_kv_heads, args.head_dim
        self.scale = args.attn_scale or args.head_dim**-0.5
        self.softcap, self.window = args.attn_softcap, args.window(index)
        self.q_proj = nn.Linear(args.dim, args.n_heads * args.head_dim, bias=args.qkv_bias)
        self.k_proj = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=args.qkv_bias)
        self.v_proj = nn.Linear(args.dim, args.n_kv_heads * args.head_dim, bias=args.qkv_bias)
        self.o_proj = nn.Linear(args.n_heads * args.head_dim, args.dim, bias=False)
        if args.qk_norm:
            self.q_norm = nn.RMSNorm(args.head_dim, eps=args.norm_eps)
            self.k_norm = nn.RMSNorm(args.head_dim, eps=args.norm_eps)
        self.rope = RoPE(args, local=args.local_rope(index))

    def __call__(self, x: mx.array, cache: KVCache) -> mx.array:
        B, T, _ = x.shape
        q = self.q_proj(x).reshape(B, T, self.n_heads, -1)  # [B, T, H, D]
        k = self.k_proj(x).reshape(B, T, self.n_kv_heads, -1)  # [B, T, K, D]
        v = self.v_proj(x).reshape(B, T, self.n_kv_heads, -1).transpose(0, 2, 1, 3)  # [B, K, T, D]
        if "q_norm" in self:  # per-head norms before RoPE (Qwen3, Gemma 3)
            q, k = self.q_norm(q), self.k_norm(k)
        q = self.rope(q.transpose(0, 2, 1, 3), offset=cache.offset)  # [B, H, T, D]
        k = self.rope(k.transpose(0, 2, 1, 3), offset=cache.offset)
        start = cache.offset
        k, v = cache.update(k, v)  # [B, K, S, D]
        if self.softcap:
            o = self._capped(q, k, v, start)
        else:
            # "causal" aligns the last query with the last key, which is right with a cache prefix.
            mask = window_mask(start, T, k.shape[2], self.window) if self.window else ("causal" if T > 1 else None)
            o = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.scale, mask=mask)  # [B, H, T, D]
        return self.o_proj(o.transpose(0, 2, 1, 3).reshape(B, T, -1))

    def _capped(self, q: mx.array, k: mx.array, v: mx.array, start: int) -> mx.array:
        """Attention with scores squashed to c·tanh(s/c) (Gemma 2): no fused kernel has the hook."""
        B, H, T, D = q.shape
        rep = self.n_heads // self.n_kv_heads
        q = q.reshape(B, self.n_kv_heads, rep, T, D)  # grouped heads share their key/value head
        scores = (q * self.scale) @ k[:, :, None].swapaxes(-1, -2)  # [B, K, rep, T, S]
        scores = mx.tanh(scores / self.softcap) * self.softcap
        mask = window_mask(start, T, k.shape[2], self.window)
        scores = mx.where(mask, scores, mx.array(-mx.inf, scores.dtype))
        probs = mx.softmax(scores.astype(mx.float32), axis=-1).astype(v.dtype)
        return (probs @ v[:, :, None]).reshape(B, H, T, D)


def window_mask(start: int, T: int, S: int, window: int) -> mx.array:
    """Boolean [T, S]: query start+t sees key s when s ≤ start+t and, with a window, start+t − s <
    window (as Hugging Face and llama.cpp mask)."""
    q_pos = mx.arange(start, start + T)[:, None]
    k_pos = mx.arange(S)[None, :]
    mask = k_pos <= q_pos
    return mask & (k_pos > q_pos - window) if window else mask


def gelu_tanh(x: mx.array) -> mx.array:
    # the tanh approximation Gemma was trained with (mlx's gelu_approx is a sigmoid fit)
    return 0.5 * x * (1 + mx.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


class MLP(nn.Module):
    def __init__(self, args: MLXModelArgs):
        super().__init__()
        self.gate_proj = nn.Linear(args.dim, args.hidden_dim, bias=False)
        self.up_proj = nn.Linear(args.dim, args.hidden_dim, bias=False)
        self.down_proj = nn.Linear(args.hidden_dim, args.dim, bias=False)
        self.act = gelu_tanh if args.mlp_act == "gelu_tanh" else nn.silu  # GeGLU (Gemma) or SwiGLU

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, args: MLXModelArgs, index: int = 0):
        super().__init__()
        self.attn_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.attn = Attention(args, index)
        self.mlp_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.mlp = MLP(args)
        if args.post_norms:  # Gemma 2/3: each branch's output normalized before the residual add
            self.post_attn_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
            self.post_mlp_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)

    def __call__(self, x: mx.array, cache: KVCache) -> mx.array:
        if "post_attn_norm" not in self:
            h = x + self.attn(self.attn_norm(x), cache)
            return h + self.mlp(self.mlp_norm(h))
        h = x + self.post_attn_norm(self.attn(self.attn_norm(x), cache))
        return h + self.post_mlp_norm(self.mlp(self.mlp_norm(h)))


class Transformer(nn.Module):
    """forward(idx [B, T] int32, caches) -> logits [B, T, V] ([B, 1, V] with ``last_only``);
    the caches advance by T."""

    def __init__(self, args: MLXModelArgs):
        super().__init__()
        self.args = args
        self.embed = nn.Embedding(args.vocab_size, args.dim)
        self.layers = [Block(args, i) for i in range(args.n_layers)]
        self.norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        if not args.tie_embeddings:
            self.lm_head = nn.Linear(args.dim, args.vocab_size, bias=False)

    def __call__(self, idx: mx.array, caches: list[KVCache], last_only: bool = False) -> mx.array:
        h = self.embed(idx)  # [B, T, C]
        if self.args.embed_scale != 1.0:  # Gemma: × √C
            h = h * mx.array(self.args.embed_scale, h.dtype)
        for layer, cache in zip(self.layers, caches):
            h = layer(h, cache)
        if last_only:
            h = h[:, -1:, :]  # prefill needs only the last position's logits
        h = self.norm(h)
        out = self.embed.as_linear(h) if self.args.tie_embeddings else self.lm_head(h)  # [B, T, V]
        cap = self.args.final_softcap
        return mx.tanh(out / cap) * cap if cap else out  # Gemma 2 soft-caps the logits

    def new_caches(self) -> list[KVCache]:
        return [KVCache() for _ in self.layers]
