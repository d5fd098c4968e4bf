"""Token sampling in MLX with the same options and order as engine.sampling: repetition penalty on
raw logits, then temperature, top-k, min-p, top-p, then one categorical draw.

Seeded draws are reproducible within this backend; they differ from the torch backend's draws
(different generators), while greedy decoding (temperature 0) is identical by construction.
"""

from __future__ import annotations

import os

import mlx.core as mx

NEG_INF = float("-inf")


class Sampler:
    """Draws one token id per call from logits [1, V], tracking the ids seen for the penalty."""

    def __init__(self, cfg, prompt_ids: list[int]):
        self.cfg = cfg
        self.seen = set(prompt_ids)
        seed = cfg.seed if cfg.seed is not None else int.from_bytes(os.urandom(4), "little")
        self.key = mx.random.key(seed)

    def __call__(self, logits: mx.array) -> mx.array:
        """logits [1, V] -> token id [1] (lazy: nothing is computed until evaluated)."""
        logits = logits.astype(mx.float32)
        if self.cfg.repetition_penalty != 1.0 and self.seen:
            logits = apply_repetition_penalty(logits, sorted(self.seen), self.cfg.repetition_penalty)
        if self.cfg.temperature == 0:
            return mx.argmax(logits, axis=-1)
        self.key, sub = mx.random.split(self.key)
        return mx.random.categorical(filter_logits(logits, self.cfg), axis=-1, key=sub)

    def accept(self, token_id: int) -> None:
        self.seen.add(token_id)


def apply_repetition_penalty(logits: mx.array, seen: list[int], penalty: float) -> mx.array:
    # CTRL's rule, as engine.sampling: divide positive logits, multiply negative ones.
    idx = mx.array(seen)
    picked = logits[:, idx]
    logits[:, idx] = mx.where(picked > 0, picked / penalty, picked * penalty)
    return logits


def filter_logits(logits: mx.array, cfg) -> mx.array:
    """Scaled logits with everything outside top-k / min-p / top-p set to -inf. [1, V] -> [1, V]"""
    logits = logits / cfg.temperature
    if 0 < cfg.top_k < logits.shape[-1]:
        kth = mx.min(mx.topk(logits, cfg.top_k, axis=-1), axis=-1, keepdims=True)
        logits = mx.where(logits < kth, NEG_INF, logits)
    if cfg.min_p > 0:
        probs = mx.softmax(logits, axis=-1)
        floor = mx.max(probs, axis=-1, keepdims=True) * cfg.min_p
        logits = mx.where(probs < floor, NEG_INF, logits)
    if cfg.top_p < 1.0:
        order = mx.argsort(-logits, axis=-1)
        ranked = mx.take_along_axis(logits, order, axis=-1)
        probs = mx.softmax(ranked, axis=-1)
        drop = mx.cumsum(probs, axis=-1) - probs > cfg.top_p  # keep the token that crosses p
        ranked = mx.where(drop, NEG_INF, ranked)
        logits = mx.put_along_axis(mx.full(logits.shape, NEG_INF), order, ranked, axis=-1)
    return logits
