"""Typed events a generation yields, in order:

    PrefillStarted → PrefillProgress* → PrefillFinished → Token* → Finished

Every event carries ``t_ns`` on the engine clock (engine.clock.now_ns). TTFT, per-token latency and
tokens/s are computed from these same events (GenerationStats.from_events), so the CLI, the GUI and
the benchmarks agree by construction. Backends (plugins) yield the same types.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import fmean


@dataclass(frozen=True, slots=True)
class PrefillStarted:
    prompt_tokens: int
    t_ns: int
    request_t_ns: int  # when the request arrived (before tokenization): TTFT starts here
    cached_tokens: int = 0  # leading prompt tokens whose KV cache was reused: not prefilled again


@dataclass(frozen=True, slots=True)
class PrefillProgress:
    done_tokens: int
    total_tokens: int
    t_ns: int


@dataclass(frozen=True, slots=True)
class PrefillFinished:
    prompt_tokens: int
    t_ns: int


@dataclass(frozen=True, slots=True)
class Token:
    index: int  # 0 for the first generated token
    token_id: int
    text: str  # the printable piece this token completes ("" while a UTF-8 sequence is incomplete)
    t_ns: int
    seq: int = 0  # which sequence, in batched generation


@dataclass(frozen=True, slots=True)
class GenerationStats:
    prompt_tokens: int
    generated_tokens: int
    ttft_ms: float
    prefill_ms: float
    prefill_tok_s: float
    decode_tok_s: float  # tokens after the first over the time after the first
    total_ms: float
    itl_ms: tuple[float, ...] = field(default=(), repr=False)  # inter-token latencies after the first
    cached_tokens: int = 0  # prompt tokens taken from the KV cache (not prefilled); prefill_tok_s excludes them
    # joules per prefilled token and per decoded token after the first (engine.energy); NaN where no
    # counter is readable, ``energy_source`` then says why ("N/A: ...")
    prefill_j_per_token: float = float("nan")
    decode_j_per_token: float = float("nan")
    energy_source: str = ""

    @property
    def tpot_ms(self) -> float:
        return fmean(self.itl_ms) if self.itl_ms else float("nan")

    def as_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "ttft_ms": self.ttft_ms,
            "prefill_ms": self.prefill_ms,
            "prefill_tok_s": self.prefill_tok_s,
            "decode_tok_s": self.decode_tok_s,
            "tpot_ms": self.tpot_ms,
            "total_ms": self.total_ms,
            "cached_tokens": self.cached_tokens,
            "prefill_j_per_token": self.prefill_j_per_token,
            "decode_j_per_token": self.decode_j_per_token,
            "energy_source": self.energy_source,
        }


@dataclass(frozen=True, slots=True)
class Finished:
    stop_reason: str  # "eos" | "stop_string" | "length" | "cancelled"
    stats: GenerationStats
    t_ns: int
    text: str = ""  # the whole generated text (sequence 0)
    tail: str = ""  # text not carried by any Token event (held-back bytes flushed at the end)


Event = PrefillStarted | PrefillProgress | PrefillFinished | Token | Finished


def stats_from_times(
    request_ns: int,
    prefill_start_ns: int,
    prefill_end_ns: int,
    prompt_tokens: int,
    token_ns: list[int],
    end_ns: int,
    cached_tokens: int = 0,
) -> GenerationStats:
    """Standard metrics: TTFT from request to first token (tokenization and prefill included); ITL between
    consecutive tokens after the first; decode tok/s = (n-1) / (t_last - t_first); prefill tok/s
    over the prompt tokens actually prefilled (not the ``cached_tokens`` reused from the KV cache)."""
    n = len(token_ns)
    prefill_ms = (prefill_end_ns - prefill_start_ns) / 1e6
    ttft_ms = (token_ns[0] - request_ns) / 1e6 if n else float("nan")
    itl = tuple((b - a) / 1e6 for a, b in zip(token_ns, token_ns[1:]))
    decode_s = (token_ns[-1] - token_ns[0]) / 1e9 if n > 1 else 0.0
    return GenerationStats(
        prompt_tokens=prompt_tokens,
        generated_tokens=n,
        ttft_ms=ttft_ms,
        prefill_ms=prefill_ms,
        prefill_tok_s=(prompt_tokens - cached_tokens) / (prefill_ms / 1e3) if prefill_ms > 0 else float("nan"),
        decode_tok_s=(n - 1) / decode_s if decode_s > 0 else float("nan"),
        total_ms=(end_ns - request_ns) / 1e6,
        itl_ms=itl,
        cached_tokens=cached_tokens,
    )
