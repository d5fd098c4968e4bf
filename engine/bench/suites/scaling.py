"""scaling: forward tokens/s and memory vs parameter count, GPT-2-shaped models, random weights.

GPT-2 small/medium/large/XL widths, depths and head counts, built as Llama-family configs (SwiGLU
MLP sized 8/3·d so parameter counts stay GPT-2-like, tied embeddings, GPT-2's vocabulary and
1024-token context). Nothing is downloaded. A size that would not fit in the memory free now is
recorded as skipped, with the numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

from opscope.engine.bench.ceilings import peaks
from opscope.engine.bench.ceilings import utilisation as U
from opscope.engine.bench.measure.options import (
    DTYPE_BYTES,
    BenchOptions,
    SuitePlan,
    check_torch_device,
    free_memory_bytes,
)
from opscope.engine.bench.measure.params import param
from opscope.engine.bench.measure.runner import Point, skipped_point
from opscope.engine.bench.suites import _model as M

NAME = "scaling"
DESCRIPTION = "GPT-2 small…XL-shaped models: forward tok/s and memory vs parameter count"

# name: (layers, dim, heads)
GPT2_SHAPES = {
    "gpt2-small": (12, 768, 12),
    "gpt2-medium": (24, 1024, 16),
    "gpt2-large": (36, 1280, 20),
    "gpt2-xl": (48, 1600, 25),
}


def gpt2_config(name: str):
    from opscope.engine.models.config import ModelConfig

    layers, dim, heads = GPT2_SHAPES[name]
    hidden = -(-int(dim * 8 / 3) // 64) * 64  # SwiGLU's 3 matrices ≈ GPT-2's 2 at 4·d
    return ModelConfig(
        dim=dim,
        n_layers=layers,
        n_heads=heads,
        n_kv_heads=heads,
        hidden_dim=hidden,
        vocab_size=50257,
        max_seq_len=1024,
        tie_embeddings=True,
    )


@dataclass(frozen=True)
class Params:
    models: tuple[str, ...] = param(
        tuple(GPT2_SHAPES), "Model shapes", "", "GPT-2-shaped models measured (gpt2-small … gpt2-xl), random weights."
    )
    batch: int = param(1, "Batch size", "sequences", "Sequences per forward pass.")
    seq: int = param(512, "Sequence length", "tokens", "Tokens per sequence in each forward pass.")


QUICK = Params(models=("gpt2-small", "gpt2-medium"), seq=32)
PARAM_CHOICES = {"models": tuple(GPT2_SHAPES)}  # checked by engine.bench.params before a run


def needed_bytes(cfg, p: Params, dtype: str) -> int:
    """Weights (built in float32, then cast), logits and a margin for activations."""
    weights = cfg.n_params * (4 + (DTYPE_BYTES[dtype] if dtype != "float32" else 0))
    logits = p.batch * p.seq * cfg.vocab_size * 4 * 2
    acts = 16 * p.batch * p.seq * max(cfg.dim, cfg.hidden_dim) * 4
    return int(weights + logits + acts)


def make_point(name: str, p: Params, opts: BenchOptions, pk: dict) -> Point:
    cfg = gpt2_config(name)

    def prepare():
        import torch
        from opscope.engine.models.transformer import Transformer

        model = Transformer.random(cfg, opts.device, getattr(torch, opts.dtype), attention=opts.attention).eval()
        toks = M.random_tokens(p.seq, cfg.vocab_size, 8, opts.device, batch=p.batch)

        def step():
            with torch.inference_mode():
                return model(toks, 0)

        return step

    tokens = p.batch * p.seq
    flops = M.forward_flops(cfg, p.seq, 0, p.seq, batch=p.batch)
    return Point(
        f"fwd_{name}",
        "tok/s",
        prepare,
        value=lambda s: tokens / s,
        params={"model": name, "n_params": cfg.n_params, "batch": p.batch, "seq": p.seq},
        device=opts.device,
        track_memory=True,
        derived=U.derived(f"fwd_{name}", "mfu", lambda tps: tps / tokens * flops, pk, "flop"),
    )


def _points(p: Params, opts: BenchOptions, pk: dict):
    for name in p.models:
        need, free = needed_bytes(gpt2_config(name), p, opts.dtype), free_memory_bytes(opts.device)
        if need > 0.7 * free:
            yield skipped_point(
                f"fwd_{name}", "tok/s", f"needs ~{need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free", {"model": name}
            )
        else:
            yield make_point(name, p, opts, pk)


def plan(opts: BenchOptions, params: Params | None = None) -> SuitePlan:
    check_torch_device(opts.device)
    p = params or (QUICK if opts.quick else Params())
    pk = {"flop": peaks.peak_set(opts.device, "matmul", opts.dtype)}
    return SuitePlan(
        points=_points(p, opts, pk),
        n_points=len(p.models),
        settings={
            "models": {n: gpt2_config(n).shape_fields() | {"n_params": gpt2_config(n).n_params} for n in p.models},
            "batch": p.batch,
            "seq": p.seq,
            "peaks": pk,
        },
    )
