"""Prefill then decode on MLX, yielding the same engine.events as the torch engine.

MLX is lazy: nothing runs until a value is needed. Each prefill chunk is evaluated before its
progress event and each sampled id is read with ``.item()`` before its Token event, so every
timestamp marks work that has finished, as on the torch backend.
"""
from __future__ import annotations

import threading
from dataclasses import replace
from typing import Iterator

import mlx.core as mx

from engine import markers
from engine.clock import now_ns
from engine.errors import ConfigError
from engine.events import Finished, PrefillFinished, PrefillProgress, PrefillStarted, Token, stats_from_times
from plugins.mlx_backend.sampling import Sampler


def text_stream(tokenizer, stop: tuple[str, ...]):
    # The engine's own stop-string and UTF-8 hold-back logic, so both backends cut text alike.
    from engine.generate import _TextStream

    return _TextStream(tokenizer, stop)


def generate(lm, prompt_ids: list[int], cfg, cancel: threading.Event | None,
             request_ns: int) -> Iterator:
    """Yield PrefillStarted, PrefillProgress*, PrefillFinished, Token*, Finished."""
    if not prompt_ids:
        raise ConfigError("the prompt is empty after tokenization; give at least one token")
    n = len(prompt_ids)
    if n + cfg.max_tokens > lm.config.max_seq_len:
        raise ConfigError(f"prompt + max_tokens = {n + cfg.max_tokens} tokens exceeds the model's "
                          f"context of {lm.config.max_seq_len}; shorten the prompt or lower --max-tokens")
    caches = lm.model.new_caches()
    lm.last_caches = caches  # memory_stats reports the KV cache of the latest request
    sampler = Sampler(cfg, prompt_ids)
    t_start = now_ns()
    yield PrefillStarted(n, t_start, request_ns)
    markers.emit(markers.PREFILL, "start", t_start, tokens=n)
    for s in range(0, n, cfg.prefill_chunk):
        logits = _forward(lm, caches, mx.array([prompt_ids[s:s + cfg.prefill_chunk]], dtype=mx.int32))
        if s + cfg.prefill_chunk < n:
            yield PrefillProgress(s + cfg.prefill_chunk, n, now_ns())
    token, token_id = _sample(lm, sampler, logits)  # the sync that ends prefill
    t_prefill = now_ns()
    markers.emit(markers.PREFILL, "end", t_prefill, tokens=n)
    yield PrefillFinished(n, t_prefill)
    yield from _decode(lm, caches, sampler, token, token_id, n, cfg, cancel,
                       (request_ns, t_start, t_prefill))


# The device's stream is entered around each computation, never across a yield, so the caller's
# own MLX work between events keeps its default device.
def _forward(lm, caches, ids: mx.array) -> mx.array:
    """ids [1, T] -> evaluated logits of the last position [1, V]."""
    with mx.stream(lm.mx_device):
        logits = lm.model(ids, caches, last_only=True)[:, -1, :]
        mx.eval(logits)
    return logits


def _sample(lm, sampler: Sampler, logits: mx.array) -> tuple[mx.array, int]:
    with mx.stream(lm.mx_device):
        token = sampler(logits)  # [1]
        return token, token.item()


def _step(lm, caches, sampler: Sampler, token: mx.array) -> tuple[mx.array, int]:
    """One decode step; building and evaluating the graph in one go lets MLX fuse the sampler."""
    with mx.stream(lm.mx_device):
        logits = lm.model(token.reshape(1, 1), caches)[:, -1, :]  # [1, V]
        token = sampler(logits)
        return token, token.item()


def _decode(lm, caches, sampler, token, token_id, n, cfg, cancel, times) -> Iterator:
    request_ns, t_start, t_prefill = times
    stream = text_stream(lm.tokenizer, cfg.stop)
    eos = set() if cfg.ignore_eos else set(lm.tokenizer.eos_ids)
    token_ns, reason = [], "length"
    markers.emit(markers.DECODE, "start", t_prefill)
    for i in range(cfg.max_tokens):
        t = now_ns() if i else t_prefill
        if token_id in eos:
            reason = "eos"
            break
        sampler.accept(token_id)
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
        token, token_id = _step(lm, caches, sampler, token)
    tail = stream.finish() if reason != "stop_string" else ""
    end = now_ns()
    markers.emit(markers.DECODE, "end", end, tokens=len(token_ns))
    stats = stats_from_times(request_ns, t_start, t_prefill, n, token_ns or [t_prefill], end)
    if not token_ns:  # EOS first: TTFT is still the time to that token; nothing was generated
        stats = replace(stats, generated_tokens=0)
    yield Finished(reason, stats, end, text=stream.text, tail=tail)
