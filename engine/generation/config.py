"""Generation settings, torch-free so that any backend plugin can use them."""

from __future__ import annotations

from dataclasses import dataclass

from opscope.engine.core.errors import ConfigError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0


@dataclass(frozen=True)
class GenerationConfig:
    max_tokens: int = 256
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    prefill_chunk: int = 512  # prompt tokens per forward pass during prefill (progress events)
    reuse_prefix: bool = True  # keep the KV cache of the prompt's prefix the last generation left (chat turns)

    def __post_init__(self) -> None:
        checks = {
            "max_tokens": self.max_tokens >= 1,
            "temperature": self.temperature >= 0,
            "top_k": self.top_k >= 0,
            "top_p": 0 < self.top_p <= 1,
            "min_p": 0 <= self.min_p < 1,
            "repetition_penalty": self.repetition_penalty > 0,
            "prefill_chunk": self.prefill_chunk >= 1,
        }
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise ConfigError(f"invalid generation setting {bad[0]}={getattr(self, bad[0])!r}")

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p, self.min_p, self.repetition_penalty)
