"""kv-cache: one decode step with the KV cache vs recomputing the whole sequence, as it grows.

With the cache a step costs one token's matmuls plus attention over the cached keys; without it,
every step re-runs the full prefix, so tokens/s falls with sequence length. Both are tokens/s of
producing the next token at sequence length L, on the same model and random tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opscope.engine.bench.measure.options import BenchOptions, SuitePlan
from opscope.engine.bench.measure.params import param
from opscope.engine.bench.measure.runner import Point, skipped_point
from opscope.engine.bench.suites import _model as M

NAME = "kv-cache"
DESCRIPTION = "decode tok/s with the KV cache vs recomputing the full sequence, as it grows"
NEEDS_MODEL = True


@dataclass(frozen=True)
class Params:
    seq_lens: tuple[int, ...] = param(
        (128, 256, 512, 1024, 2048), "Sequence lengths", "tokens", "Sequence lengths measured, one point each."
    )


QUICK = Params(seq_lens=(16, 64))


def cached_point(lm, L: int, opts: BenchOptions) -> Point:
    def prepare():
        import torch

        toks = M.random_tokens(L + 1, lm.config.vocab_size, L, lm.device)
        lm.model.setup_cache(1, L + 1)
        M.fill_cache(lm.model, toks[:, :L])

        def step():  # the token at position L, reading L cached keys
            with torch.inference_mode():
                return lm.model(toks[:, L:], L, last_only=True)

        return step

    return Point(
        f"decode_cached@{L}",
        "tok/s",
        prepare,
        value=lambda s: 1.0 / s,
        params={"seq": L, "mode": "kv-cache"},
        device=opts.device,
    )


def recompute_point(lm, L: int, opts: BenchOptions) -> Point:
    def prepare():
        import torch

        toks = M.random_tokens(L + 1, lm.config.vocab_size, L, lm.device)
        lm.model.drop_cache()  # no cache: attention over the full causal prefix every time

        def step():
            with torch.inference_mode():
                return lm.model(toks, 0, last_only=True)

        return step

    return Point(
        f"decode_recompute@{L}",
        "tok/s",
        prepare,
        value=lambda s: 1.0 / s,
        params={"seq": L, "mode": "recompute"},
        device=opts.device,
    )


def _points(lm, p: Params, opts: BenchOptions):
    for L in p.seq_lens:
        for mode, make in (("cached", cached_point), ("recompute", recompute_point)):
            if L + 1 > lm.config.max_seq_len:
                yield skipped_point(
                    f"decode_{mode}@{L}", "tok/s", f"needs {L + 1} positions, the model has {lm.config.max_seq_len}"
                )
            else:
                yield make(lm, L, opts)


def plan(opts: BenchOptions, params: Params | None = None, model: Any = None) -> SuitePlan:
    p = params or (QUICK if opts.quick else Params())
    lm = model if model is not None else M.load_model(opts)
    return SuitePlan(
        points=_points(lm, p, opts),
        n_points=2 * len(p.seq_lens),
        settings={"seq_lens": list(p.seq_lens), "model": lm.describe()},
        model_source=lm.source,
        close=lm.model.drop_cache,
    )
