"""The Llama family as data: one frozen config covers Llama 2/3, SmolLM/SmolLM2, Mistral and Qwen2."""
from __future__ import annotations

from dataclasses import dataclass, replace

from engine.errors import UnsupportedModelError

SUPPORTED_ARCHS = ("llama", "mistral", "qwen2", "smollm")


@dataclass(frozen=True)
class RopeScaling:
    kind: str  # "linear" | "llama3"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192


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

    def __post_init__(self):
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.dim // self.n_heads)
        if self.arch not in SUPPORTED_ARCHS:
            raise UnsupportedModelError(
                f"architecture {self.arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHS)})")
        bad = {k: v for k, v in self.shape_fields().items() if not 0 < v <= 1 << 24}
        if bad or self.n_heads % self.n_kv_heads:
            raise UnsupportedModelError(f"model config has impossible sizes: {bad or self.shape_fields()}")

    def shape_fields(self) -> dict[str, int]:
        return {"dim": self.dim, "n_layers": self.n_layers, "n_heads": self.n_heads,
                "n_kv_heads": self.n_kv_heads, "hidden_dim": self.hidden_dim,
                "vocab_size": self.vocab_size, "head_dim": self.head_dim}

    def with_(self, **changes) -> "ModelConfig":
        return replace(self, **changes)

    @property
    def n_params(self) -> int:
        attn = self.dim * self.head_dim * (self.n_heads * 2 + self.n_kv_heads * 2)
        mlp = 3 * self.dim * self.hidden_dim
        embed = self.vocab_size * self.dim * (1 if self.tie_embeddings else 2)
        return self.n_layers * (attn + mlp + 2 * self.dim) + embed + self.dim

    def flops_per_token(self, context_len: int = 0) -> float:
        """Forward FLOPs per token: 2 per weight multiply-add (embedding lookup excluded) plus
        attention scores and values over ``context_len`` keys (nanoGPT's estimate_mfu)."""
        matmul_params = self.n_params - self.vocab_size * self.dim * (0 if self.tie_embeddings else 1)
        attn = 2 * 2 * self.n_layers * self.n_heads * self.head_dim * context_len
        return 2.0 * matmul_params + attn

    def kv_bytes_per_token(self, bytes_per_el: int) -> int:
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * bytes_per_el
