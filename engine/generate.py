"""Prefill then decode with a preallocated KV cache, as a generator of typed events (engine.events).

Per decode step the host talks to the device exactly twice: the sampled id stays on the device as
the next input, and one ``.item()`` brings it back for text and stop checks (the only sync).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Iterator

import torch

from engine import markers
from engine.clock import now_ns
from engine.errors import ConfigError
from engine.events import Finished, PrefillFinished, PrefillProgress, PrefillStarted, Token, stats_from_times
from engine.sampling import SamplingParams, sample

CACHE_ROUND = 256  # the static cache grows in steps so that most requests reuse it


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

    def __post_init__(self):
        checks = {
            "max_tokens": self.max_tokens >= 1, "temperature": self.temperature >= 0,
            "top_k": self.top_k >= 0, "top_p": 0 < self.top_p <= 1, "min_p": 0 <= self.min_p < 1,
            "repetition_penalty": self.repetition_penalty > 0, "prefill_chunk": self.prefill_chunk >= 1,
        }
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise ConfigError(f"invalid generation setting {bad[0]}={getattr(self, bad[0])!r}")

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_k, self.top_p, self.min_p, self.repetition_penalty)


def ensure_cache(model, batch: int, length: int) -> None:
    if length > model.config.max_seq_len:
        raise ConfigError(f"prompt + max_tokens = {length} tokens exceeds the model's context of "
                          f"{model.config.max_seq_len}; shorten the prompt or lower --max-tokens")
    cache = model.layers[0].attn.cache
    if cache is None or model.max_cache_len < length or cache.k.shape[0] < batch:
        size = min(model.config.max_seq_len, -(-length // CACHE_ROUND) * CACHE_ROUND)
        model.setup_cache(batch, size)


class _TextStream:
    """Printable text out of token ids, holding back any tail that could start a stop string."""

    def __init__(self, tokenizer, stop: tuple[str, ...]):
        self.decoder, self.stop = tokenizer.stream(), stop
        self.text, self.emitted = "", 0

    def push(self, token_id: int) -> tuple[str, bool]:
        self.text += self.decoder.push(token_id)
        for s in self.stop:
            i = self.text.find(s, max(0, self.emitted - len(s)))
            if i >= 0:
                self.text = self.text[:i]
                return self._take(len(self.text)), True
        hold = max((k for s in self.stop for k in range(1, len(s)) if self.text.endswith(s[:k])), default=0)
        return self._take(len(self.text) - hold), False

    def finish(self) -> str:
        self.text += self.decoder.flush()
        return self._take(len(self.text))

    def _take(self, upto: int) -> str:
        piece, self.emitted = self.text[self.emitted:max(upto, self.emitted)], max(upto, self.emitted)
        return piece


def generate(model, tokenizer, prompt_ids: list[int], cfg: GenerationConfig = GenerationConfig(),
             cancel: threading.Event | None = None, request_ns: int | None = None) -> Iterator:
    """Yield PrefillStarted, PrefillProgress*, PrefillFinished, Token*, Finished."""
    request_ns = now_ns() if request_ns is None else request_ns
    if not prompt_ids:
        raise ConfigError("the prompt is empty after tokenization; give at least one token")
    n = len(prompt_ids)
    ensure_cache(model, 1, n + cfg.max_tokens)
    device = model.embed.weight.device
    gen = torch.Generator(device=device)
    gen.manual_seed(cfg.seed if cfg.seed is not None else torch.seed())
    history = torch.zeros(n + cfg.max_tokens, dtype=torch.long, device=device)
    stream, eos = _TextStream(tokenizer, cfg.stop), set() if cfg.ignore_eos else set(tokenizer.eos_ids)
    with torch.inference_mode():
        ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)  # the one prompt upload
        history[:n] = ids[0]
        t_start = now_ns()
        yield PrefillStarted(n, t_start, request_ns)
        markers.emit(markers.PREFILL, "start", t_start, tokens=n)
        for s in range(0, n, cfg.prefill_chunk):
            logits = model(ids[:, s:s + cfg.prefill_chunk], s, last_only=True)
            if s + cfg.prefill_chunk < n:
                yield PrefillProgress(s + cfg.prefill_chunk, n, now_ns())
        nxt = sample(logits[:, -1], cfg.sampling, history[:n], gen)  # [1]
        token_id = int(nxt.item())  # sync: prefill is done when this returns
        t_prefill = now_ns()
        markers.emit(markers.PREFILL, "end", t_prefill, tokens=n)
        yield PrefillFinished(n, t_prefill)
        yield from _decode(model, nxt, token_id, n, cfg, history, gen, stream, eos, cancel,
                           (request_ns, t_start, t_prefill))


def _decode(model, nxt, token_id, n, cfg, history, gen, stream, eos, cancel, times) -> Iterator:
    request_ns, t_start, t_prefill = times
    token_ns, reason = [], "length"
    markers.emit(markers.DECODE, "start", t_prefill)
    for i in range(cfg.max_tokens):
        t = now_ns() if i else t_prefill
        if token_id in eos:
            reason = "eos"
            break
        history[n + i] = nxt[0]
        piece, stopped = stream.push(token_id)
        token_ns.append(t)
        yield Token(i, token_id, piece, t)
        if stopped:
            reason = "stop_string"
            break
        if cancel is not None and cancel.is_set():
            reason = "cancelled"
            break
        if i + 1 == cfg.max_tokens:
            break
        logits = model(nxt.view(1, 1), n + i)
        nxt = sample(logits[:, -1], cfg.sampling, history[:n + i + 1], gen)
        token_id = int(nxt.item())
    tail = stream.finish() if reason != "stop_string" else ""
    end = now_ns()
    markers.emit(markers.DECODE, "end", end, tokens=len(token_ns))
    # EOS as the very first token: TTFT is still the time to that token; nothing was generated
    stats = stats_from_times(request_ns, t_start, t_prefill, n, token_ns or [t_prefill], end)
    if not token_ns:
        stats = replace(stats, generated_tokens=0)
    yield Finished(reason, stats, end, text=stream.text, tail=tail)
