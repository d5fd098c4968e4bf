"""Prefill then decode with a preallocated KV cache, as a generator of typed events (engine.events).

Per decode step the host talks to the device exactly twice: the sampled id stays on the device as
the next input, and one ``.item()`` brings it back for text and stop checks (the only sync).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
from opscope.engine.core import markers
from opscope.engine.core.clock import now_ns
from opscope.engine.core.errors import ConfigError
from opscope.engine.generation import prefix_cache
from opscope.engine.generation.config import GenerationConfig
from opscope.engine.generation.decode_book import DecodeBook, decode_events
from opscope.engine.generation.events import Finished, PrefillFinished, PrefillProgress, PrefillStarted
from opscope.engine.generation.sampling import sample
from opscope.engine.telemetry import energy

if TYPE_CHECKING:
    from opscope.engine.core.cpuload import LoadAwareThreads, OtherLoad
    from opscope.engine.generation.events import Event
    from opscope.engine.models.transformer import Transformer
    from opscope.engine.tokenizer.loader import Tokenizer

log = logging.getLogger(__name__)

__all__ = ["GenerationConfig", "generate", "ensure_cache"]

CACHE_ROUND = 256  # the static cache grows in steps so that most requests reuse it


def ensure_cache(model: Transformer, batch: int, length: int, keep: int = 0) -> None:
    """A cache of at least ``batch`` rows and ``length`` positions. The caller writes it, so what it
    held is forgotten (engine.prefix_cache), except positions 0..keep-1 of row 0 (single-sequence
    generate reusing a prefix): copied over when the cache has to grow."""
    if length > model.config.max_seq_len:
        raise ConfigError(
            f"prompt + max_tokens = {length} tokens exceeds the model's context of "
            f"{model.config.max_seq_len}; shorten the prompt or lower --max-tokens"
        )
    if not keep:
        prefix_cache.forget(model)
    cache = model.layers[0].attn.cache
    if cache is None or model.max_cache_len < length or cache.k.shape[0] < batch:
        step = getattr(getattr(model, "decode_step", None), "cache_round", CACHE_ROUND)
        size = min(model.config.max_seq_len, -(-length // step) * step)
        old = [layer.attn.cache for layer in model.layers]
        model.setup_cache(batch, size)
        if keep:
            prefix_cache.keep_on_resize(model, old, keep)


WARM_UP_TOKENS = 16


def warm_up(model: Transformer) -> None:
    """A prefill of WARM_UP_TOKENS and one decode step, results thrown away, so that a device's
    one-time costs (library handles, kernels loaded on first use) fall in the load and not in the
    first reply's TTFT: on an H200 a fresh process's first request took 160-450 ms to its first
    token where later ones took 11-14 (docs/gpu.md), and llama.cpp warms up the same way. The cache
    it wrote is forgotten (engine.prefix_cache): the next request prefills from position 0."""
    n = max(1, min(WARM_UP_TOKENS, model.config.max_seq_len - 1))  # a tiny context holds fewer
    ensure_cache(model, 1, n + 1)
    device = model.embed.weight.device
    ids = torch.zeros(1, n, dtype=torch.long, device=device)
    with torch.inference_mode():
        model(ids, 0, last_only=True)
        model(ids[:, :1], n)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    prefix_cache.forget(model)


def _generator(cfg: GenerationConfig, device: torch.device) -> torch.Generator | None:
    """A seeded generator for sampling; none for greedy. The meta device (trace stand-in) has none."""
    if cfg.temperature == 0:
        return None
    gen = torch.Generator(device=device if device.type != "meta" else "cpu")
    gen.manual_seed(cfg.seed if cfg.seed is not None else torch.seed())
    return gen


def generate(
    model: Transformer,
    tokenizer: Tokenizer,
    prompt_ids: list[int],
    cfg: GenerationConfig = GenerationConfig(),
    cancel: threading.Event | None = None,
    request_ns: int | None = None,
) -> Iterator[Event]:
    """Yield PrefillStarted, PrefillProgress*, PrefillFinished, Token*, Finished.

    With ``cfg.reuse_prefix`` the leading prompt tokens whose K/V the cache already holds (the
    previous generation's prompt and reply: engine.prefix_cache) are kept and only the rest is
    prefilled, from that position on; Finished's stats count them as ``cached_tokens``."""
    request_ns = now_ns() if request_ns is None else request_ns
    if not prompt_ids:
        raise ConfigError("the prompt is empty after tokenization; give at least one token")
    n = len(prompt_ids)
    reused = prefix_cache.reusable(model, prompt_ids) if cfg.reuse_prefix else 0
    ensure_cache(model, 1, n + cfg.max_tokens, keep=reused)
    record = prefix_cache.open_record(model, prompt_ids[:reused])
    try:
        yield from _generate(model, tokenizer, prompt_ids, reused, record, cfg, cancel, request_ns)
    finally:  # also when the consumer stops early: the record covers what was written
        prefix_cache.seal(model, record)


def _generate(
    model: Transformer,
    tokenizer: Tokenizer,
    prompt_ids: list[int],
    reused: int,
    record: prefix_cache.PrefixRecord,
    cfg: GenerationConfig,
    cancel: threading.Event | None,
    request_ns: int,
) -> Iterator[Event]:
    n = len(prompt_ids)
    device = model.embed.weight.device
    gen = _generator(cfg, device)
    history = torch.zeros(n + cfg.max_tokens, dtype=torch.long, device=device)
    with torch.inference_mode():
        # built on the host, then one upload the placement trace can see
        ids = torch.tensor([prompt_ids], dtype=torch.long).to(device)
        history[:n] = ids[0]
        meter = energy.meter_for(device)
        prefill_energy = meter.span()
        t_start = now_ns()
        yield PrefillStarted(n, t_start, request_ns, cached_tokens=reused)
        reuse_fields = {"cached": reused} if reused else {}  # marker ``tokens``: those prefilled
        markers.emit(markers.PREFILL, "start", t_start, tokens=n - reused, **reuse_fields)
        with prefill_threads(model):
            for s in range(reused, n, cfg.prefill_chunk):
                logits = model(ids[:, s : s + cfg.prefill_chunk], s, last_only=True)
                record.ids.extend(prompt_ids[s : s + cfg.prefill_chunk])
                if s + cfg.prefill_chunk < n:
                    yield PrefillProgress(s + cfg.prefill_chunk, n, now_ns())
        nxt = sample(logits[:, -1], cfg.sampling, history[:n], gen)  # [1]
        token_id = int(nxt.item())  # sync: prefill is done when this returns
        t_prefill = now_ns()
        prefill_j, decode_energy = prefill_energy.joules(), meter.span()
        markers.emit(markers.PREFILL, "end", t_prefill, tokens=n - reused, **reuse_fields)
        yield PrefillFinished(n, t_prefill)
        book = DecodeBook(tokenizer, cfg, n, (request_ns, t_start, t_prefill), cancel)
        for event in _decode(model, nxt, token_id, n, cfg, history, gen, book, record.ids):
            if isinstance(event, Finished):
                event = energy.with_energy(_with_cached(event, reused), meter, prefill_j, decode_energy.joules())
            yield event


def _with_cached(done: Finished, cached: int) -> Finished:
    """Finished with ``cached_tokens`` set and prefill tok/s over the tokens actually prefilled."""
    st = done.stats
    rate = (st.prompt_tokens - cached) / (st.prefill_ms / 1e3) if st.prefill_ms > 0 else st.prefill_tok_s
    return replace(done, stats=replace(st, cached_tokens=cached, prefill_tok_s=rate))


_other_load: OtherLoad | None = None  # other processes' busy cores since the previous prefill


def prefill_load() -> OtherLoad:
    """The process's OtherLoad reader (made on first use)."""
    global _other_load
    if _other_load is None:
        from opscope.engine.core.cpuload import OtherLoad

        _other_load = OtherLoad()
    return _other_load


@contextmanager
def prefill_threads(model: Any, load: OtherLoad | None = None) -> Iterator[None]:
    """Prefill on the CPU with the cores other processes left free since the previous prefill (at
    least 1): under outside load every parallel region of the prefill waits for a descheduled
    worker (issue 31: TTFT 9,054 ms with 2 threads, 412 ms with 1, same prompt). Other devices,
    and a load not known yet (the first prefill, no /proc), keep the thread count."""
    have = torch.get_num_threads()
    if model.embed.weight.device.type != "cpu" or have == 1:
        yield
        return
    load = load or prefill_load()
    others = load.cores()
    want = have if others is None else max(1, min(have, int(load.n_cpus - others + 0.5)))
    if want == have:
        yield
        return
    log.info("prefill on %d of %d threads: other processes kept %.1f cores busy", want, have, others)
    torch.set_num_threads(want)
    try:
        yield
    finally:
        torch.set_num_threads(have)


@contextmanager
def decode_threads(model: torch.nn.Module) -> Iterator[LoadAwareThreads | None]:
    """Run decode steps with ``model.decode_threads`` intra-op threads, then restore the count;
    yields None, or for ``"auto"`` an engine.cpuload.LoadAwareThreads that the loop steps per token.

    The plain model asks for one thread (its batch-1 matmuls use one anyway; more only wait on
    a busy core); the fast path's fused step uses every thread, so it takes "auto": all of them
    unless other processes are busy (docs/decisions/0003-decode-threads-yield-to-busy-cores.md)."""
    want = getattr(model, "decode_threads", None)
    have = torch.get_num_threads()
    if want == "auto":
        from opscope.engine.core.cpuload import LoadAwareThreads

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


def _decode(
    model: Transformer,
    nxt: torch.Tensor,
    token_id: int,
    n: int,
    cfg: GenerationConfig,
    history: torch.Tensor,
    gen: torch.Generator | None,
    book: DecodeBook,
    held: list[int] | None = None,
) -> Iterator[Event]:
    with decode_threads(model) as threads:
        yield from _decode_loop(model, nxt, token_id, n, cfg, history, gen, book, threads, held)


def _decode_loop(
    model: Transformer,
    nxt: torch.Tensor,
    token_id: int,
    n: int,
    cfg: GenerationConfig,
    history: torch.Tensor,
    gen: torch.Generator | None,
    book: DecodeBook,
    threads: LoadAwareThreads | None = None,
    held: list[int] | None = None,
) -> Iterator[Event]:
    """Token* then Finished (engine.decode_book); ``nxt`` [1] is the token sampled from the prefill
    (``token_id`` on the host), kept on the device as the next input. Each token fed to the model
    is appended to ``held`` (the ids the KV cache holds) once its step has written the cache."""

    def advance(i: int, ids: list[int]) -> list[int]:
        nonlocal nxt
        history[n + i] = nxt[0]
        if threads is not None:
            threads.step()
        logits = model(nxt.view(1, 1), n + i)
        if held is not None:
            held.append(ids[0])
        nxt = sample(logits[:, -1], cfg.sampling, history[: n + i + 1], gen)
        return [int(nxt.item())]  # the step's one sync

    yield from decode_events(book, [token_id], advance)
