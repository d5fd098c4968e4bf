"""Which token ids the model's KV cache holds (sequence 0, batch 1), so that a new prompt sharing a
prefix with them (the next chat turn) prefills only the rest, as llama.cpp's server does.

The record lives on the model (``model.kv_prefix``) and describes one KVCache object (layer 0's):
``setup_cache``/``drop_cache`` make or drop those objects, so a record of an older cache is never
used. A path that writes the cache in place (batched generation, a trace, a cache-less reference
pass) calls :func:`forget`; engine.generate.ensure_cache does so for every caller but generate.

A generation first marks the record *open* (what it holds is being written) and seals it only when
it ends, with a snapshot of layer 0's keys over the held positions: a record is reused only when it
is sealed and that snapshot (one KV head's keys) still matches the cache bit for bit, so a writer that bypassed all of
the above (a direct ``model(...)`` call on the same buffers) disables the reuse instead of
corrupting the next reply.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from opscope.engine.models.transformer import KVCache, Transformer


@dataclass(eq=False)
class PrefixRecord:
    cache: object  # layer 0's KVCache the ids describe
    ids: list[int] = field(default_factory=list)  # token at each cache position 0..len-1
    keys: torch.Tensor | None = None  # layer 0's K (head 0) over those positions once sealed; None while open


def _cache(model: Transformer) -> KVCache | None:
    cache: KVCache | None = model.layers[0].attn.cache
    return cache


def _keys(cache: KVCache, m: int) -> torch.Tensor:
    """Row 0's keys of KV head 0 at positions 0..m-1 [m, D]: a token written over any of them
    changes them (one head is enough to notice, and 1/K of the memory of all)."""
    return cache.k[0, :m, 0]


def forget(model: Transformer) -> None:
    """Nothing in the cache may be reused any more (the caller writes it another way)."""
    model.kv_prefix = None


def held(model: Transformer) -> list[int]:
    """The ids whose K/V the cache holds at positions 0.. (row 0); [] when unknown or stale."""
    rec = getattr(model, "kv_prefix", None)
    cache = _cache(model)
    if rec is None or rec.keys is None or cache is None or rec.cache is not cache or not rec.ids:
        return []
    m = len(rec.ids)
    if cache.k.shape[1] < m or not torch.equal(_keys(cache, m), rec.keys):
        return []
    return list(rec.ids)


def reusable(model: Transformer, prompt_ids: list[int]) -> int:
    """How many leading positions of ``prompt_ids`` the cache already holds; at most len - 1, so the
    last prompt token is always recomputed and gives the logits to sample from."""
    ids = held(model)
    n = min(len(ids), len(prompt_ids) - 1)
    i = 0
    while i < n and ids[i] == prompt_ids[i]:
        i += 1
    return i


def open_record(model: Transformer, ids: list[int]) -> PrefixRecord:
    """Mark the cache as being written by one generation, holding ``ids`` so far; the generation
    appends to ``record.ids`` after each forward pass that wrote more positions, then seals it."""
    rec = PrefixRecord(_cache(model), list(ids))
    model.kv_prefix = rec
    return rec


def seal(model: Transformer, rec: PrefixRecord) -> None:
    """End of the generation that opened ``rec``: make it reusable, unless something invalidated or
    replaced it meanwhile (another generation, ``forget``, a new cache)."""
    cache = _cache(model)
    if getattr(model, "kv_prefix", None) is not rec or rec.cache is not cache or not rec.ids:
        if getattr(model, "kv_prefix", None) is rec:
            forget(model)
        return
    rec.keys = _keys(cache, len(rec.ids)).clone()


def keep_on_resize(model: Transformer, old_caches: list, keep: int) -> None:
    """After ``setup_cache`` allocated a larger cache: copy positions 0..keep-1 of row 0 from
    ``old_caches`` (one KVCache per layer) and re-seal the record over them."""
    rec = getattr(model, "kv_prefix", None)
    if rec is None or keep == 0:
        forget(model)
        return
    for layer, old in zip(model.layers, old_caches):
        layer.attn.cache.k[0, :keep] = old.k[0, :keep]
        layer.attn.cache.v[0, :keep] = old.v[0, :keep]
    model.kv_prefix = PrefixRecord(_cache(model), rec.ids[:keep])
    seal(model, model.kv_prefix)


def aligned_ids(model: Transformer, tokenizer: Any, text: str, ids: list[int]) -> list[int]:
    """``ids`` (``text`` tokenized) with its head replaced by the ids the cache holds wherever they
    spell the same text. A sampled reply is often not the canonical tokenization of its own text
    ("12345" generated as "123"+"45" re-tokenizes as "1234"+"5"), so the next turn's re-rendered
    prompt diverged from the cache mid-reply and re-read the rest of the conversation. Falls back
    to ``ids`` unless the merged ids decode to exactly what ``ids`` decode to."""
    have = held(model)
    common = _common_prefix(have, ids)
    if common >= len(have) or not text.startswith(tokenizer.decode(have[:common])):
        return ids
    k = _longest_text_prefix(tokenizer, have, text, common)
    if k <= common:
        return ids
    head = tokenizer.decode(have[:k])
    merged = have[:k] + tokenizer.encode(text[len(head) :], add_special_tokens=False)
    return merged if tokenizer.decode(merged) == tokenizer.decode(ids) else ids


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _longest_text_prefix(tokenizer: Any, have: list[int], text: str, lo: int) -> int:
    """The largest k in [lo, len(have)] whose ``decode(have[:k])`` starts ``text`` (binary search:
    a longer run of ids decodes to a longer text, so the property holds up to some k and not after)."""
    hi = len(have)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if text.startswith(tokenizer.decode(have[:mid])):
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(frozen=True)
class Snapshot:
    """Row 0's K/V over the held positions, on the host: what a model reload puts back."""

    ids: tuple[int, ...]
    kv: tuple  # one (k, v) pair per layer, [m, H, D] each


def snapshot(model: Transformer) -> Snapshot | None:
    """A host copy of what the cache holds (None when nothing is reusable): taken before the
    worker drops a model to load another file, so that a failed load restores the conversation's
    cache along with the model."""
    ids = held(model)
    if not ids:
        return None
    m = len(ids)
    kv = tuple(
        (layer.attn.cache.k[0, :m].to("cpu", copy=True), layer.attn.cache.v[0, :m].to("cpu", copy=True))
        for layer in model.layers
    )
    return Snapshot(tuple(ids), kv)


def restore(model: Transformer, snap: Snapshot | None) -> None:
    """Put ``snap`` back into ``model``'s cache (the same model reloaded) and make it reusable."""
    if snap is None or len(snap.kv) != len(model.layers):
        return
    from opscope.engine.generation.generate import ensure_cache

    m = len(snap.ids)
    ensure_cache(model, 1, m)
    for layer, (k, v) in zip(model.layers, snap.kv):
        cache = layer.attn.cache
        if cache.k.shape[2:] != k.shape[1:]:
            forget(model)
            return
        cache.k[0, :m] = k.to(cache.k.device, cache.k.dtype)
        cache.v[0, :m] = v.to(cache.v.device, cache.v.dtype)
    model.kv_prefix = PrefixRecord(_cache(model), list(snap.ids))
    seal(model, model.kv_prefix)
