"""The Llama family (Llama 2/3, SmolLM/SmolLM2, Mistral, Qwen2) as one data-driven PyTorch model.

Shapes: B batch, T new tokens, S cache length, H query heads, K kv heads, D head dim, C model dim,
V vocabulary. RoPE is the rotate-half form; GGUF Q/K weights are un-permuted at load.
Everything a forward pass creates is created on the model's device (placement trace checks it).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Protocol

import torch
import torch.nn as nn
import torch.nn.functional as F
from opscope.engine.models.config import ModelConfig, RopeScaling

ATTENTION_IMPLS = ("sdpa", "naive")


class RMSNorm(nn.Module):
    # A one-pass kernel (x, weight, eps) → y for float32 inference, set by a backend that has one
    # (the CPU fast path): torch's CPU rms_norm is ~6 elementwise passes over [T, C] at prefill.
    fused: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor] | None = None

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.out_dtype: torch.dtype | None = None  # the matmuls' dtype, where activations differ from it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (
            self.fused is not None
            and x.dtype == torch.float32
            and self.weight.dtype == torch.float32
            and not torch.is_grad_enabled()
            and not torch.compiler.is_compiling()
        ):
            y = self.fused(x, self.weight, self.eps)
        else:
            y = F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)
        return y if self.out_dtype is None else y.to(self.out_dtype)


class KVCache(nn.Module):
    """Static cache stored [B,S,K,D]: the used prefix [:, :end] stays one dense block per row, the
    layout SDPA's CPU kernel reads fastest (docs/decisions/0006-kv-cache-layout.md)."""

    def __init__(self, batch: int, n_kv_heads: int, max_seq: int, head_dim: int, dtype, device):
        super().__init__()
        shape = (batch, max_seq, n_kv_heads, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def update(self, start: int | torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # k, v: [B,T,K,D] written at positions start..start+T; returns views [B,K,S,D] over 0..start+T.
        # A tensor ``start`` ([1], on the device: the static decode step) writes one position and
        # returns the whole cache, so every step has the same shapes (CUDA graphs).
        if isinstance(start, torch.Tensor):
            self.k.index_copy_(1, start, k)
            self.v.index_copy_(1, start, v)
            return self.k.transpose(1, 2), self.v.transpose(1, 2)
        B, end = k.shape[0], start + k.shape[1]
        self.k[:B, start:end] = k
        self.v[:B, start:end] = v
        return self.k[:B, :end].transpose(1, 2), self.v[:B, :end].transpose(1, 2)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, impl: str):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.impl = "naive" if cfg.attn_softcap else impl  # SDPA has no hook for a score softcap
        self.scale, self.softcap = cfg.attn_scale or None, cfg.attn_softcap
        self.q_proj = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.norm_eps)
        self.cache: KVCache | None = None
        # A fused prefill kernel, set by a backend that has one (the CPU fast path): (q, k, v [B,T,·,D]
        # before RoPE, cos, sin, cache k, cache v, start, scale or 0) → [B,T,H*D]; it applies RoPE,
        # writes the cache and attends causally over positions 0..start+T.
        self.prefill: Callable[..., torch.Tensor] | None = None
        # q, k and v of x in one call, set by a backend that fuses the three projections (the CPU
        # fast path's int8 prefill: x quantized once): x [B,T,dim] → (q, k, v) [B,T,·]
        self.project: Callable[[torch.Tensor], tuple[torch.Tensor, ...]] | None = None

    def forward(self, x, cos, sin, start: int, mask) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = self.project(x) if self.project is not None else (self.q_proj(x), self.k_proj(x), self.v_proj(x))
        q = q.view(B, T, self.n_heads, self.head_dim)  # [B,T,H,D]
        k = k.view(B, T, self.n_kv, self.head_dim)  # [B,T,K,D]
        v = v.view(B, T, self.n_kv, self.head_dim)
        if hasattr(self, "q_norm"):  # per-head norms run in the activation dtype (their weights')
            q, k = self.q_norm(q.to(self.q_norm.weight.dtype)), self.k_norm(k.to(self.k_norm.weight.dtype))
        if self.prefill is not None and self.cache is not None and self._fused_prefill(q, v, start, mask):
            y = self.prefill(q, k, v, cos, sin, self.cache.k, self.cache.v, start, self.scale or 0.0)
            return self.o_proj(y.to(x.dtype))
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.cache is not None:
            k, v = self.cache.update(start, k, v)  # [B,K,S,D], in the cache's dtype
            q = q.to(k.dtype)
        else:
            k, v = k.transpose(1, 2), v.transpose(1, 2).to(k.dtype)
        y = attend(q.transpose(1, 2), k, v, mask, self.impl, self.scale, self.softcap)  # [B,H,T,D]
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1).to(x.dtype))

    def _fused_prefill(self, q, v, start: int, mask) -> bool:
        """Whether ``self.prefill`` takes this call: several float32 queries, plain causal (no mask,
        no softcap), a float32 cache, inference outside torch.compile."""
        return (
            self.prefill is not None
            and self.cache is not None
            and mask is None
            and q.shape[1] > 1
            and isinstance(start, int)
            and not self.softcap
            and self.impl == "sdpa"
            and q.dtype == v.dtype == self.cache.k.dtype == torch.float32
            and not torch.is_grad_enabled()
            and not torch.compiler.is_compiling()
        )


@contextlib.contextmanager
def varying_shape_attention(device: torch.device, cached: bool) -> Iterator[None]:
    """SDPA without cuDNN's backend on CUDA for a model with a KV cache: every prompt length and
    every decode step is a new shape there, and cuDNN builds an execution graph per new shape
    (40-450 ms on an H200, each step of a first request; docs/decisions/0010). Flash and
    memory-efficient attention have no per-shape setup. The flag is torch's, process-wide, so it
    is restored on the way out; training and cache-free passes keep torch's choice."""
    if device.type != "cuda" or not cached or torch.compiler.is_compiling() or torch.is_grad_enabled():
        yield
        return
    was = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        yield
    finally:
        torch.backends.cuda.enable_cudnn_sdp(was)


def attend(q, k, v, mask, impl: str, scale: float | None = None, softcap: float = 0.0) -> torch.Tensor:
    """Causal attention with grouped KV heads. ``mask`` is None (plain causal, aligned ends) or a
    boolean [B|1, 1, T, S] where True means attend. ``scale`` None → 1/√D; ``softcap`` > 0 squashes
    the scaled scores to c·tanh(s/c) before the mask (Gemma 2; the naive path only)."""
    if impl == "sdpa":
        if mask is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=q.shape[2] > 1, enable_gqa=True, scale=scale)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True, scale=scale)
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    scores = (q @ k.transpose(-2, -1)) * (scale or 1.0 / math.sqrt(q.shape[-1]))  # [B,H,T,S]
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is None:
        T, S = q.shape[2], k.shape[2]
        mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T)
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores.float(), dim=-1).to(q.dtype) @ v


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x [B,T,H,D]; cos/sin [B|1,T,1,D]; rotate-half form (Hugging Face layout)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)
        self.up_proj = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)
        self.down_proj = nn.Linear(cfg.hidden_dim, cfg.dim, bias=False)
        self.gelu = cfg.mlp_act == "gelu_tanh"  # GeGLU (Gemma) instead of SwiGLU

    def forward(self, x):
        g = self.gate_proj(x)
        g = F.gelu(g, approximate="tanh") if self.gelu else F.silu(g)
        return self.down_proj(g * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, impl: str, index: int = 0):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(cfg, impl)
        self.mlp_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.mlp = MLP(cfg)
        if cfg.post_norms:  # Gemma 2/3: normalize each branch's output before the residual add
            self.post_attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
            self.post_mlp_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.window, self.local_rope = cfg.window(index), cfg.local_rope(index)

    def forward(self, x, cos, sin, start, mask):
        if not hasattr(self, "post_attn_norm"):
            x = x + self.attn(self.attn_norm(x), cos, sin, start, mask)
            return x + self.mlp(self.mlp_norm(x))
        x = x + self.post_attn_norm(self.attn(self.attn_norm(x), cos, sin, start, mask).to(x.dtype))
        return x + self.post_mlp_norm(self.mlp(self.mlp_norm(x)).to(x.dtype))


class DecodeStep(Protocol):
    """What ``Transformer.set_decode_step`` takes: one batch-1 single-token step, idx [1,1] at the
    int position ``pos`` → logits [1,1,V], or None to let the model's own forward run this step
    (engine.models.compiled declines positions its graph does not cover)."""

    def __call__(self, idx: torch.Tensor, pos: int) -> torch.Tensor | None: ...


class Transformer(nn.Module):
    # Batch-1 single-token decode steps go here instead of plain_forward when set (the compiled
    # step, the fast path's fused C++ step); None runs every call through plain_forward.
    decode_step: DecodeStep | None = None

    def __init__(self, cfg: ModelConfig, attention: str = "sdpa"):
        super().__init__()
        if attention not in ATTENTION_IMPLS:
            raise ValueError(f"attention must be one of {ATTENTION_IMPLS}")
        self.config, self.attention = cfg, attention
        self.embed = embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg, attention, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        self.register_buffer("inv_freq", rope_inv_freq(cfg, None), persistent=False)
        if cfg.rope_local_theta:  # the windowed layers' own RoPE base (Gemma 3)
            self.register_buffer("inv_freq_local", rope_inv_freq(cfg, None, local=True), persistent=False)
        self.max_cache_len = 0
        self.act_dtype = torch.float32

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)  # .to(), .cuda(), .half(), ...
        self.settle_precision()
        return self

    def settle_precision(self) -> None:
        """Pick the activation dtype for the weights' dtype and device (``activation_dtype``): the
        residual stream, norms, RoPE and KV cache use it; matmul inputs use the weights' dtype."""
        w = self.embed.weight
        self.act_dtype = activation_dtype(w.dtype, w.device)
        feeds_matmul = {
            id(n)
            for n in [layer.attn_norm for layer in self.layers]
            + [layer.mlp_norm for layer in self.layers]
            + [self.norm]
        }
        for norm in (m for m in self.modules() if isinstance(m, RMSNorm)):
            if norm.weight.dtype != self.act_dtype and norm.weight.device.type != "meta":
                norm.weight.data = norm.weight.data.to(self.act_dtype)
            # post and q/k norms feed the residual stream or RoPE: they stay in the activation dtype
            norm.out_dtype = None if self.act_dtype == w.dtype or id(norm) not in feeds_matmul else w.dtype

    @classmethod
    def random(cls, cfg: ModelConfig, device="cpu", dtype=torch.float32, attention="sdpa", seed: int = 0):
        """Random-init model (synthetic benchmarks, training steps): nothing is downloaded."""
        torch.manual_seed(seed)
        with torch.device(device):
            model = cls(cfg, attention)
        for p in model.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02)
        if cfg.tie_embeddings:
            model.lm_head.weight = model.embed.weight
        return model.to(dtype)  # settles the precision (_apply)

    def tie_weights(self) -> None:
        if self.config.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    def setup_cache(self, max_batch: int, max_seq_len: int) -> None:
        """Preallocate the KV cache on the model's device, in the activation dtype."""
        p = self.embed.weight
        for layer in self.layers:
            layer.attn.cache = KVCache(
                max_batch, self.config.n_kv_heads, max_seq_len, self.config.head_dim, self.act_dtype, p.device
            )
        self.max_cache_len = max_seq_len

    def drop_cache(self) -> None:
        for layer in self.layers:
            layer.attn.cache = None
        self.max_cache_len = 0

    def set_decode_step(self, step: DecodeStep | None) -> None:
        """Route batch-1 single-token decode steps (``is_decode_step``) to ``step``; None restores
        plain_forward for every call."""
        self.decode_step = step

    def forward(
        self,
        idx: torch.Tensor,
        input_pos: int | torch.Tensor = 0,
        *,
        pad: torch.Tensor | None = None,
        last_only: bool = False,
    ) -> torch.Tensor:
        """idx [B,T] → logits [B,T,V] (or [B,1,V] with ``last_only``). ``input_pos`` is the position of
        idx[:, 0] (an int, so no host sync is needed); ``pad`` [B] counts left-padding tokens per row
        (batched generation): their keys are masked and positions start after them."""
        if idx.device.type != "cuda":  # per token: no context to enter where it changes nothing
            return self._step_or_plain(idx, input_pos, pad, last_only)
        with varying_shape_attention(idx.device, cached=bool(self.max_cache_len)):
            return self._step_or_plain(idx, input_pos, pad, last_only)

    def _step_or_plain(self, idx, input_pos, pad, last_only: bool) -> torch.Tensor:
        if self.decode_step is not None and self.is_decode_step(idx, pad):
            pos = int(input_pos[0]) if isinstance(input_pos, torch.Tensor) else int(input_pos)
            logits = self.decode_step(idx, pos)  # [1,1,V], the same with or without last_only
            if logits is not None:
                return logits
        return self.plain_forward(idx, input_pos, pad=pad, last_only=last_only)

    def plain_forward(
        self,
        idx: torch.Tensor,
        input_pos: int | torch.Tensor = 0,
        *,
        pad: torch.Tensor | None = None,
        last_only: bool = False,
    ) -> torch.Tensor:
        """forward without the decode step: the model's own layers (what a compiled step compiles)."""
        B, T = idx.shape
        start = int(input_pos[0]) if isinstance(input_pos, torch.Tensor) else int(input_pos)
        pos = torch.arange(start, start + T, device=idx.device)  # [T]
        pos = pos.unsqueeze(0) - pad.unsqueeze(1) if pad is not None else pos.unsqueeze(0)  # [B|1,T]
        mask = self._mask(B, T, start, pad, idx.device)
        slots = None
        if self.windowed:  # cache slots of the queries [T] and keys [S], for sliding-window masks
            slots = (
                torch.arange(start, start + T, device=idx.device),
                torch.arange(start + T if self.max_cache_len else T, device=idx.device),
            )
        x = self._layers(self.embed_tokens(idx), pos.clamp(min=0), start, mask, slots)  # [B,T,C]
        if last_only:
            x = x[:, -1:]
        return self.logits(x)

    def embed_tokens(self, idx: torch.Tensor) -> torch.Tensor:
        """idx [B,T] → embeddings [B,T,C] in the activation dtype (× embed_scale: Gemma's √C)."""
        x = self.embed(idx).to(self.act_dtype)
        return x * self.config.embed_scale if self.config.embed_scale != 1.0 else x

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Final norm and output head; Gemma 2 soft-caps the logits."""
        y = self.lm_head(self.norm(x))
        cap = self.config.final_softcap
        return torch.tanh(y / cap) * cap if cap else y

    @property
    def windowed(self) -> bool:
        return any(layer.window for layer in self.layers)

    def set_rope(self, freq_factors: torch.Tensor | None = None, device=None) -> None:
        """(Re)compute the RoPE tables on ``device`` (loaders build on meta; llama.cpp's rope_freqs
        tensor, when the file has one, carries Llama 3.1's scaling)."""
        device = device if device is not None else self.embed.weight.device
        self.inv_freq = rope_inv_freq(self.config, freq_factors).to(device)
        if self.config.rope_local_theta:
            self.inv_freq_local = rope_inv_freq(self.config, None, local=True).to(device)

    def _layers(self, x, pos, start, mask, slots):
        """x through every layer. pos [B|1,T]: RoPE positions; mask: the global mask (None: plain
        causal); slots: (query slots [T], key slots [S]) for sliding-window masks, or None."""
        rope = {False: rope_cos_sin(self.inv_freq, pos, self.act_dtype)}
        rope[True] = (
            rope_cos_sin(self.inv_freq_local, pos, self.act_dtype) if self.config.rope_local_theta else rope[False]
        )
        masks = {0: mask}
        for layer in self.layers:
            if layer.window not in masks:
                q_slots, k_slots = slots
                masks[layer.window] = window_mask(mask, q_slots, k_slots, layer.window)
            cos, sin = rope[layer.local_rope]
            x = layer(x, cos, sin, start, masks[layer.window])
        return x

    def is_decode_step(self, idx: torch.Tensor, pad) -> bool:
        """A batch-1 single-token step with a KV cache and no autograd: what a decode step
        (``set_decode_step``) takes over; everything else runs plain_forward."""
        return pad is None and idx.shape == (1, 1) and bool(self.max_cache_len) and not torch.is_grad_enabled()

    def decode_static(self, idx: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """One batch-1 decode step with shapes that do not depend on the position: idx [1,1], pos [1]
        (int64, on the model's device) → logits [1,1,V]. Attention reads the whole static cache under
        a mask, so a compiled step can be captured once as a CUDA graph and replayed (gpt-fast's
        scheme); no host sync. Needs ``setup_cache(1, S)``."""
        k_pos = torch.arange(self.max_cache_len, device=idx.device)
        mask = (k_pos <= pos).view(1, 1, 1, -1)  # [1,1,1,S]
        return self.logits(self._layers(self.embed_tokens(idx), pos.view(1, 1), pos, mask, (pos.view(1), k_pos)))

    def _mask(self, B: int, T: int, start: int, pad, device):
        if pad is None and (start == 0 or T == 1):
            return None  # plain causal (SDPA's is_causal) or a single query that sees every key
        S = start + T if self.max_cache_len else T
        q_pos = torch.arange(start, start + T, device=device).view(1, 1, T, 1)
        k_pos = torch.arange(S, device=device).view(1, 1, 1, S)
        mask = k_pos <= q_pos  # [1,1,T,S]
        if pad is not None:
            mask = mask & (k_pos >= pad.view(B, 1, 1, 1))  # [B,1,T,S]
            # A query that is itself padding would attend to nothing (NaN): let it see itself.
            mask = mask | (k_pos == q_pos)
        return mask


def window_mask(mask, q_pos: torch.Tensor, k_pos: torch.Tensor, window: int) -> torch.Tensor:
    """``mask`` (None: plain causal) narrowed to keys less than ``window`` slots behind their query
    (q - k < window, as Hugging Face and llama.cpp mask): [B|1,1,T,S]."""
    T, S = q_pos.shape[0], k_pos.shape[0]
    near = (k_pos.view(1, S) > q_pos.view(T, 1) - window).view(1, 1, T, S)
    if mask is None:
        mask = (k_pos.view(1, S) <= q_pos.view(T, 1)).view(1, 1, T, S)
    return mask & near


def embedding(n: int, dim: int) -> nn.Embedding:
    """nn.Embedding, initialized as torch does except on the meta device (models built there get
    their weights assigned): normal_ has only a Python meta kernel, whose first call imports ~800
    modules (sympy, torch._refs), +70 MB RSS for the life of the process."""
    w = torch.empty(n, dim)  # on the device of an enclosing ``with torch.device(...)``
    if w.device.type != "meta":
        nn.init.normal_(w)
    return nn.Embedding(n, dim, _weight=w)


def activation_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The weights' dtype, except half types on the CPU, where activations stay float32 (as in
    llama.cpp) and only matmul inputs are cast: there bf16 F.rms_norm is a composite of ~10 ops
    (53 µs per call inside decode vs ~10 µs in float32) and attention over a bf16 KV cache costs 5-8×
    the float32 one (batch-1 decode at S=128: 128 vs 21 µs per layer)."""
    if device.type == "cpu" and dtype in (torch.bfloat16, torch.float16):
        return torch.float32
    return dtype


def rope_inv_freq(cfg: ModelConfig, freq_factors: torch.Tensor | None, local: bool = False) -> torch.Tensor:
    """RoPE inverse frequencies [D/2]; ``local``: the windowed layers' base, unscaled (Gemma 3)."""
    d = cfg.head_dim
    theta = cfg.rope_local_theta if local else cfg.rope_theta
    # computed on the CPU, then moved to the enclosing ``with torch.device(...)``: on the meta device
    # ``theta ** t`` runs a Python meta kernel whose first call imports sympy & co (+60 MB RSS)
    device = torch.empty(0).device
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64, device="cpu") / d))
    if local:
        return inv.float().to(device)
    if freq_factors is not None:  # llama.cpp's rope_freqs tensor (Llama 3.1 scaling baked in)
        inv = inv / freq_factors.to("cpu", torch.float64)
    elif cfg.rope_scaling is not None:
        inv = _scale_inv_freq(inv, cfg.rope_scaling)
    return inv.float().to(device)


def _scale_inv_freq(inv: torch.Tensor, rs: RopeScaling) -> torch.Tensor:
    if rs.kind == "linear":
        return inv / rs.factor
    # llama3: long wavelengths scaled by factor, short kept, smooth blend between
    wavelen = 2 * math.pi / inv
    low_wl = rs.original_max_position / rs.low_freq_factor
    high_wl = rs.original_max_position / rs.high_freq_factor
    smooth = (rs.original_max_position / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor)
    scaled = torch.where(wavelen > low_wl, inv / rs.factor, inv)
    mid = (wavelen <= low_wl) & (wavelen >= high_wl)
    return torch.where(mid, (1 - smooth) * inv / rs.factor + smooth * inv, scaled)


def rope_cos_sin(inv_freq: torch.Tensor, pos: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    # pos [B|1,T] → cos, sin [B|1,T,1,D]
    freqs = pos.unsqueeze(-1).float() * inv_freq  # [B,T,D/2]
    emb = torch.cat((freqs, freqs), dim=-1).unsqueeze(2)
    return emb.cos().to(dtype), emb.sin().to(dtype)
