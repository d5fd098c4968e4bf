"""Prefill then decode with a preallocated KV cache, as a generator of typed events (engine.events).

Per decode step the host talks to the device exactly twice: the sampled id stays on the device as
the next input, and one ``.item()`` brings it back for text and stop checks (the only sync).
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import replace
from typing import Iterator

import torch

from engine import markers
from engine.clock import now_ns
from engine.errors import ConfigError
from engine.events import Finished, PrefillFinished, PrefillProgress, PrefillStarted, Token, stats_from_times
from engine.generation_config import GenerationConfig
from engine.sampling import sample
from engine.textstream import TextStream

__all__ = ["GenerationConfig", "generate", "ensure_cache"]

CACHE_ROUND = 256  # the static cache grows in steps so that most requests reuse it


def ensure_cache(model, batch: int, length: int) -> None:
    if length > model.config.max_seq_len:
        raise ConfigError(f"prompt + max_tokens = {length} tokens exceeds the model's context of "
                          f"{model.config.max_seq_len}; shorten the prompt or lower --max-tokens")
    cache = model.layers[0].attn.cache
    if cache is None or model.max_cache_len < length or cache.k.shape[0] < batch:
        step = getattr(model, "cache_round", CACHE_ROUND)
        size = min(model.config.max_seq_len, -(-length // step) * step)
        model.setup_cache(batch, size)


def _generator(cfg: GenerationConfig, device: torch.device) -> torch.Generator | None:
    """A seeded generator for sampling; none for greedy. The meta device (trace stand-in) has none."""
    if cfg.temperature == 0:
        return None
    gen = torch.Generator(device=device if device.type != "meta" else "cpu")
    gen.manual_seed(cfg.seed if cfg.seed is not None else torch.seed())
    return gen


def generate(model, tokenizer, prompt_ids: list[int], cfg: GenerationConfig = GenerationConfig(),
             cancel: threading.Event | None = None, request_ns: int | None = None) -> Iterator:
    """Yield PrefillStarted, PrefillProgress*, PrefillFinished, Token*, Finished."""
    request_ns = now_ns() if request_ns is None else request_ns
    if not prompt_ids:
        raise ConfigError("the prompt is empty after tokenization; give at least one token")
    n = len(prompt_ids)
    ensure_cache(model, 1, n + cfg.max_tokens)
    device = model.embed.weight.device
    gen = _generator(cfg, device)
    history = torch.zeros(n + cfg.max_tokens, dtype=torch.long, device=device)
    stream, eos = TextStream(tokenizer, cfg.stop), set() if cfg.ignore_eos else set(tokenizer.eos_ids)
    with torch.inference_mode():
        # built on the host, then one upload the placement trace can see
        ids = torch.tensor([prompt_ids], dtype=torch.long).to(device)
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


@contextmanager
def decode_threads(model):
    """Run decode steps with ``model.decode_threads`` intra-op threads, then restore the count;
    yields None, or for ``"auto"`` an engine.cpuload.LoadAwareThreads that the loop steps per token.

    Batch-1 matmuls use one thread here anyway (DESIGN.md); the extra threads only join the tiny
    parallel regions of norms and attention, and when another process holds the second core each
    region waits for a descheduled worker: decode measured 17 tok/s with 1 thread and 3.8 with 2
    on this 2-core machine under load (interleaved, same run). The fast path's fused step does use
    every thread, so it takes "auto": all of them unless other processes are busy."""
    want = getattr(model, "decode_threads", None)
    have = torch.get_num_threads()
    if want == "auto":
        from engine.cpuload import LoadAwareThreads

        try:
            yield LoadAwareThreads(have, torch.set_num_threads)
        finally:
            torch.set_num_threads(have)
        return
    if want is None or want == have:
        yield None
        return
    torch.set_num_threads(want)
    try:
        yield None
    finally:
        torch.set_num_threads(have)


def _decode(model, nxt, token_id, n, cfg, history, gen, stream, eos, cancel, times) -> Iterator:
    with decode_threads(model) as threads:
        yield from _decode_loop(model, nxt, token_id, n, cfg, history, gen, stream, eos, cancel, times, threads)


def _decode_loop(model, nxt, token_id, n, cfg, history, gen, stream, eos, cancel, times, threads=None) -> Iterator:
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
        if threads is not None:
            threads.step()
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
