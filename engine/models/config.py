"""Decoder-only transformers as data: one frozen config covers the Llama core and the switches the
families in engine.models.families set on it (Mistral, Qwen2/3, Gemma 2/3, Phi-3). Every switch
defaults to Llama behaviour."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from opscope.engine.core.errors import InvalidHyperparameters, UnsupportedModelError

SUPPORTED_ARCHS = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "smollm")
MLP_ACTIVATIONS = ("silu", "gelu_tanh")


@dataclass(frozen=True)
class RopeScaling:
    kind: str  # "linear" | "llama3"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192


MAX_SIZE = 1 << 24


def check_hyperparameters(cfg: ModelConfig) -> None:
    """Sizes positive and consistent before anything divides by them or allocates from them;
    InvalidHyperparameters names the field (the loaders add the file)."""

    def bad(detail: str):
        raise InvalidHyperparameters(None, detail)

    for name in ("dim", "n_layers", "n_heads", "n_kv_heads", "hidden_dim", "vocab_size", "max_seq_len"):
        v = getattr(cfg, name)
        if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= MAX_SIZE:
            bad(f"{name} is {v!r}: it must be an integer from 1 to {MAX_SIZE}")
    if isinstance(cfg.head_dim, bool) or not isinstance(cfg.head_dim, int) or not 0 <= cfg.head_dim <= MAX_SIZE:
        bad(f"head_dim is {cfg.head_dim!r}: it must be an integer from 1 to {MAX_SIZE}")
    if cfg.head_dim == 0 and cfg.dim % cfg.n_heads:
        bad(f"{cfg.n_heads} heads do not divide the width {cfg.dim} (and no head dim is given)")
    if (cfg.head_dim or cfg.dim // cfg.n_heads) % 2:
        bad(f"head dim {cfg.head_dim or cfg.dim // cfg.n_heads} is odd; rotary embeddings need an even one")
    if cfg.n_heads % cfg.n_kv_heads:
        bad(f"{cfg.n_kv_heads} kv heads do not divide the {cfg.n_heads} query heads")
    for name in (
        "norm_eps",
        "rope_theta",
        "embed_scale",
        "attn_scale",
        "attn_softcap",
        "final_softcap",
        "rope_local_theta",
    ):
        v = getattr(cfg, name)
        if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            bad(f"{name} is {v!r}: it must be a finite number ≥ 0")
    if cfg.rope_theta <= 0:
        bad(f"rope_theta is {cfg.rope_theta!r}: it must be > 0")
    if cfg.rope_scaling is not None and not (math.isfinite(cfg.rope_scaling.factor) and cfg.rope_scaling.factor > 0):
        bad(f"rope scaling factor is {cfg.rope_scaling.factor!r}: it must be a finite number > 0")
    if any(w < 0 for w in (cfg.sliding_window, *cfg.layer_windows)):
        bad(f"sliding window is negative ({min((cfg.sliding_window, *cfg.layer_windows))})")


@dataclass(frozen=True)
class ModelConfig:
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    hidden_dim: int
    vocab_size: int
    head_dim: int = 0  # 0 → dim // n_heads
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    max_seq_len: int = 2048
    tie_embeddings: bool = False
    qkv_bias: bool = False
    arch: str = "llama"
    # Switches of the shared core; the defaults are Llama's (engine.models.families sets them).
    qk_norm: bool = False  # RMSNorm over each head's q and k before RoPE (Qwen3, Gemma 3)
    post_norms: bool = False  # norms on the attention and MLP outputs before the residual add (Gemma 2/3)
    mlp_act: str = "silu"  # gate activation: "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
    embed_scale: float = 1.0  # embeddings × this (Gemma: √dim)
    attn_scale: float = 0.0  # query scale; 0 → 1/√head_dim
    attn_softcap: float = 0.0  # scores → c·tanh(scores/c) when > 0 (Gemma 2)
    final_softcap: float = 0.0  # logits → c·tanh(logits/c) when > 0 (Gemma 2)
    sliding_window: int = 0  # keys within this many positions of the query; 0 → all
    layer_windows: tuple[int, ...] = ()  # per-layer window (0 = global); () → sliding_window everywhere
    rope_local_theta: float = 0.0  # RoPE base of windowed layers, unscaled (Gemma 3); 0 → the global RoPE

    def __post_init__(self):
        check_hyperparameters(self)
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.dim // self.n_heads)
        if self.arch not in SUPPORTED_ARCHS:
            raise UnsupportedModelError(
                f"architecture {self.arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHS)})"
            )
        if self.mlp_act not in MLP_ACTIVATIONS:
            raise UnsupportedModelError(
                f"MLP activation {self.mlp_act!r} is not supported (supported: {', '.join(MLP_ACTIVATIONS)})"
            )
        if self.layer_windows and len(self.layer_windows) != self.n_layers:
            raise UnsupportedModelError(
                f"layer_windows has {len(self.layer_windows)} entries for {self.n_layers} layers"
            )

    def shape_fields(self) -> dict[str, int]:
        return {
            "dim": self.dim,
            "n_layers": self.n_layers,
            "n_heads": self.n_heads,
            "n_kv_heads": self.n_kv_heads,
            "hidden_dim": self.hidden_dim,
            "vocab_size": self.vocab_size,
            "head_dim": self.head_dim,
        }

    def with_(self, **changes) -> ModelConfig:
        return replace(self, **changes)

    def window(self, layer: int) -> int:
        """Sliding-window size of ``layer`` (0: it attends to every earlier position)."""
        return self.layer_windows[layer] if self.layer_windows else self.sliding_window

    def local_rope(self, layer: int) -> bool:
        """Whether ``layer`` uses the local RoPE base (``rope_local_theta``) instead of the global one."""
        return bool(self.rope_local_theta) and self.window(layer) > 0

    @property
    def is_llama_core(self) -> bool:
        """True when no switch departs from the plain Llama block (what the fused C++ decode step runs)."""
        return (
            not self.qk_norm
            and not self.post_norms
            and self.mlp_act == "silu"
            and self.embed_scale == 1.0
            and self.attn_scale == 0.0
            and not self.attn_softcap
            and not self.final_softcap
            and not any(self.window(i) for i in range(self.n_layers))
            and not self.rope_local_theta
        )

    @property
    def n_params(self) -> int:
        attn = self.dim * self.head_dim * (self.n_heads * 2 + self.n_kv_heads * 2)
        mlp = 3 * self.dim * self.hidden_dim
        embed = self.vocab_size * self.dim * (1 if self.tie_embeddings else 2)
        norms = (4 if self.post_norms else 2) * self.dim + (2 * self.head_dim if self.qk_norm else 0)
        bias = self.head_dim * (self.n_heads + 2 * self.n_kv_heads) if self.qkv_bias else 0
        return self.n_layers * (attn + mlp + norms + bias) + embed + self.dim
