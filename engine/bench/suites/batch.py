"""batch: decode throughput vs per-sequence latency for batch sizes 1…32.

Each point prefills B random prompts into the KV cache (untimed), then times G decode steps of
[B,1] tokens through the model's forward: throughput is B·G tokens over the time, and the
per-sequence latency is the time of one step (each sequence gets one token per step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opscope.engine.bench.measure.devsync import synchronizer
from opscope.engine.bench.measure.options import DTYPE_BYTES, BenchOptions, SuitePlan, free_memory_bytes
from opscope.engine.bench.measure.params import param
from opscope.engine.bench.measure.runner import Derived, Point, skipped_point
from opscope.engine.bench.suites import _model as M

NAME = "batch"
DESCRIPTION = "batch 1…32: decode throughput (tok/s) vs per-sequence latency (ms/token)"
NEEDS_MODEL = True


@dataclass(frozen=True)
class Params:
    batches: tuple[int, ...] = param(
        (1, 2, 4, 8, 16, 32),
        "Batch sizes",
        "sequences",
        "Sequences decoded together, one point each: throughput against per-sequence latency.",
    )
    prompt: int = param(
        128, "Prompt length", "tokens", "Tokens in the KV cache of every sequence before decoding starts."
    )
    steps: int = param(32, "Decode steps", "tokens", "Tokens decoded per sequence in each timed repetition.")


QUICK = Params(batches=(1, 2, 4), prompt=16, steps=4)


def batch_point(lm, B: int, p: Params, opts: BenchOptions) -> Point:
    def prepare():
        import torch

        lm.model.setup_cache(B, p.prompt + p.steps)
        M.fill_cache(lm.model, M.random_tokens(p.prompt, lm.config.vocab_size, 5, lm.device, batch=B))
        toks = M.random_tokens(p.steps, lm.config.vocab_size, 6, lm.device, batch=B)  # [B,G]
        sync = synchronizer(opts.device)

        def step():
            with torch.inference_mode():
                for i in range(p.steps):
                    lm.model(toks[:, i : i + 1], p.prompt + i, last_only=True)
                    sync(None)  # a served token is one the host has seen

        return step

    n_tok = B * p.steps
    return Point(
        f"batch{B}",
        "tok/s",
        prepare,
        value=lambda s: n_tok / s,
        params={"batch": B, "prompt": p.prompt, "steps": p.steps},
        device=opts.device,
        track_memory=True,
        derived=(Derived(f"batch{B}.latency", "ms", lambda tps: B / tps * 1e3, higher_is_better=False),),
    )


def _points(lm, p: Params, opts: BenchOptions):
    kv = M.kv_bytes_per_position(lm.config, DTYPE_BYTES[opts.dtype])
    for B in p.batches:
        need = B * (p.prompt + p.steps) * kv + 2 * B * lm.config.vocab_size * 4
        free = free_memory_bytes(opts.device)
        if need > 0.5 * free:
            yield skipped_point(f"batch{B}", "tok/s", f"needs ~{need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free")
        elif p.prompt + p.steps > lm.config.max_seq_len:
            yield skipped_point(f"batch{B}", "tok/s", f"prompt + steps exceed the model's {lm.config.max_seq_len}")
        else:
            yield batch_point(lm, B, p, opts)


def plan(opts: BenchOptions, params: Params | None = None, model: Any = None) -> SuitePlan:
    p = params or (QUICK if opts.quick else Params())
    lm = model if model is not None else M.load_model(opts)
    return SuitePlan(
        points=_points(lm, p, opts),
        n_points=len(p.batches),
        settings={"batches": list(p.batches), "prompt": p.prompt, "steps": p.steps, "model": lm.describe()},
        model_source=lm.source,
        close=lm.model.drop_cache,
    )
