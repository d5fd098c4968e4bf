"""train-step: forward + backward + AdamW on a small Llama-family model with random weights.

Toggles, each its own point: autocast bfloat16, autocast float16 with a GradScaler, gradient
checkpointing of every block, gradient accumulation. The batch is fixed, so a working step must
memorize it: a point whose loss does not fall over its repetitions fails, and fails the run (a step
that does not train is broken, not fast). Tokens/s counts every token that went through the model
per optimizer step; MFU uses 3× the forward FLOPs (the usual 6·N per token plus attention).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from opscope.engine.bench.ceilings import peaks
from opscope.engine.bench.ceilings import utilisation as U
from opscope.engine.bench.measure.options import BenchOptions, SuitePlan, check_torch_device
from opscope.engine.bench.measure.params import param
from opscope.engine.bench.measure.runner import Extra, Point
from opscope.engine.bench.suites import _model as M

NAME = "train-step"
DESCRIPTION = "forward+backward+AdamW tok/s and memory; autocast, checkpointing, accumulation"


@dataclass(frozen=True)
class Variant:
    label: str
    autocast: str | None = None  # "bfloat16" | "float16" (float16 also scales the loss)
    checkpoint: bool = False
    accum: int = 1


VARIANTS = (
    Variant("fp32"),
    Variant("autocast_bf16", "bfloat16"),
    Variant("autocast_fp16", "float16"),
    Variant("grad_ckpt", checkpoint=True),
    Variant("grad_accum4", accum=4),
)


@dataclass(frozen=True)
class Params:
    dim: int = param(256, "Model width", "elements", "Hidden size of the small Llama-shaped model trained.")
    n_layers: int = param(4, "Layers", "", "Transformer blocks of the trained model.")
    n_heads: int = param(4, "Attention heads", "", "Query heads per layer.")
    n_kv_heads: int = param(
        2, "KV heads", "", "Key/value heads per layer (fewer than the query heads: grouped-query attention)."
    )
    hidden_dim: int = param(688, "MLP width", "elements", "Hidden size of the feed-forward block.")
    vocab_size: int = param(
        4096, "Vocabulary size", "tokens", "Tokens in the model's vocabulary (the size of the output layer)."
    )
    batch: int = param(4, "Batch size", "sequences", "Sequences per optimizer step.")
    seq: int = param(128, "Sequence length", "tokens", "Tokens per sequence in each forward pass.")
    lr: float = param(3e-3, "Learning rate", "", "AdamW's learning rate; the run checks that the loss decreases.")
    variants: tuple[Variant, ...] = param(
        VARIANTS,
        "Variants",
        "",
        "Training setups measured, as JSON: autocast dtype, activation checkpointing, gradient accumulation.",
    )

    def model_config(self):
        from opscope.engine.models.config import ModelConfig

        return ModelConfig(
            dim=self.dim,
            n_layers=self.n_layers,
            n_heads=self.n_heads,
            n_kv_heads=self.n_kv_heads,
            hidden_dim=self.hidden_dim,
            vocab_size=self.vocab_size,
            max_seq_len=self.seq,
            tie_embeddings=True,
        )


QUICK = Params(dim=64, n_layers=2, n_heads=2, n_kv_heads=1, hidden_dim=172, vocab_size=512, batch=2, seq=32)


def loss_decreased(extras: dict[str, list[float]]) -> str | None:
    """None when the losses fell over the run; else why the point is invalid."""
    losses = extras.get("loss", [])
    if len(losses) < 2 or not all(math.isfinite(x) for x in losses):
        return f"loss is not finite or too few steps: {losses[:5]}"
    k = max(1, len(losses) // 3)
    first, last = sum(losses[:k]) / k, sum(losses[-k:]) / k
    if not last < first:
        return f"loss did not decrease over {len(losses)} steps ({first:.4g} → {last:.4g})"
    return None


def _checkpoint_blocks(model) -> None:
    """Recompute each block's activations in backward instead of storing them."""
    from torch.utils.checkpoint import checkpoint

    for block in model.layers:
        inner = block.forward
        block.forward = lambda *a, _f=inner: checkpoint(_f, *a, use_reentrant=False)


def _setup(p: Params, v: Variant, opts: BenchOptions):
    """Model, optimizer, loss scaler (float16 only) and the fixed data for one variant."""
    import torch
    from opscope.engine.models.transformer import Transformer

    dev = torch.device(opts.device)
    model = Transformer.random(p.model_config(), dev, torch.float32, attention=opts.attention, seed=0).train()
    if v.checkpoint:
        _checkpoint_blocks(model)
    opt = torch.optim.AdamW(model.parameters(), lr=p.lr)
    # float16 gradients of a small model overflow at the default 2**16 scale: start lower so the
    # first steps are not all skipped
    scaler = torch.amp.GradScaler(dev.type, init_scale=2.0**10) if v.autocast == "float16" else None
    data = M.random_tokens(p.seq, p.vocab_size, 7, dev, batch=p.batch * v.accum)  # [B·accum,T]
    return model, opt, scaler, data


def _trainer(p: Params, v: Variant, opts: BenchOptions):
    """The step to time: one optimizer update over ``accum`` micro-batches → the mean loss."""
    import torch
    import torch.nn.functional as F

    model, opt, scaler, data = _setup(p, v, opts)
    dev, amp_dtype = data.device, getattr(torch, v.autocast or "bfloat16")

    def micro(idx):
        with torch.autocast(dev.type, dtype=amp_dtype, enabled=v.autocast is not None):
            logits = model(idx, 0)  # [B,T,V]
        return F.cross_entropy(logits[:, :-1].float().flatten(0, 1), idx[:, 1:].flatten())

    def step():
        opt.zero_grad(set_to_none=True)
        total = torch.zeros((), device=dev)
        for idx in data.split(p.batch):
            loss = micro(idx) / v.accum
            (scaler.scale(loss) if scaler else loss).backward()
            total += loss.detach()
        if scaler:
            scaler.step(opt)
            scaler.update()
        else:
            opt.step()
        return total

    return step


def make_point(p: Params, v: Variant, opts: BenchOptions, pk: dict[str, dict]) -> Point:
    tokens = p.batch * p.seq * v.accum
    flops = 3 * M.forward_flops(p.model_config(), p.seq, 0, p.seq, batch=p.batch * v.accum)
    peak = {"flop": pk[v.autocast or "float32"]}
    name = f"train_{v.label}"
    return Point(
        name,
        "tok/s",
        lambda: _trainer(p, v, opts),
        value=lambda s: tokens / s,
        params={
            "variant": v.label,
            "autocast": v.autocast,
            "checkpoint": v.checkpoint,
            "accum": v.accum,
            "batch": p.batch,
            "seq": p.seq,
        },
        device=opts.device,
        track_memory=True,
        observe=lambda loss: {f"{name}.loss": float(loss)},
        extras=(Extra(f"{name}.loss", "nats"),),
        check=lambda ex: loss_decreased({"loss": ex.get(f"{name}.loss", [])}),
        derived=U.derived(name, "mfu", lambda tps: tps / tokens * flops, peak, "flop"),
    )


def plan(opts: BenchOptions, params: Params | None = None) -> SuitePlan:
    check_torch_device(opts.device)
    p = params or (QUICK if opts.quick else Params())
    pk = {dt: peaks.peak_set(opts.device, "matmul", dt) for dt in {v.autocast or "float32" for v in p.variants}}
    cfg = p.model_config()
    return SuitePlan(
        points=[make_point(p, v, opts, pk) for v in p.variants],
        n_points=len(p.variants),
        settings={
            "model_config": cfg.shape_fields(),
            "n_params": cfg.n_params,
            "batch": p.batch,
            "seq": p.seq,
            "lr": p.lr,
            "optimizer": "AdamW",
            "variants": [v.__dict__ for v in p.variants],
            "peaks": pk,
            "weights": "float32 master weights",
            "loss_check": "mean of the last third of losses < mean of the first third",
        },
    )
