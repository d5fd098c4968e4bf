"""Tensor-parallel Llama-family decode: Megatron's split of each block over the ranks of a group.

Per block (gpt-fast's tp.py scheme): q/k/v and gate/up are column-parallel (each rank keeps the
output rows of its heads / its slice of the hidden dim), o and down are row-parallel (the matching
input columns) and their partial outputs are summed by one ``all_reduce`` each: two per block per
forward. Query and KV heads are split alike, so a rank's query heads use exactly its own KV heads
(GQA groups never straddle ranks) and each rank's KV cache holds only its heads. The embedding,
the norms and the output head stay whole on every rank (dense float32 weights).

``shard_model`` works in place on the plain torch model (engine.models.llama.Transformer) as
loaded: weights are sliced per rank, the rest freed. ``CommMeter`` times what happens inside the
all_reduces, so a decode step's communication share can be reported per rank.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from opscope.engine.errors import ConfigError

__all__ = ["CommMeter", "check_tp", "shard_model", "shard_linear"]


def check_tp(cfg, world: int) -> None:
    """One ConfigError line if ``cfg`` (a ModelConfig) cannot be split over ``world`` ranks."""
    if world < 1:
        raise ConfigError(f"--nproc {world}: give at least 1 process")
    if cfg.n_kv_heads % world:
        raise ConfigError(f"--nproc {world} does not divide the model's {cfg.n_kv_heads} KV heads "
                          f"({cfg.n_heads} query heads): tensor parallelism splits whole KV heads, use --nproc "
                          f"{' or '.join(str(n) for n in range(1, cfg.n_kv_heads + 1) if cfg.n_kv_heads % n == 0)}")
    if cfg.hidden_dim % world:
        raise ConfigError(f"--nproc {world} does not divide the model's MLP hidden size {cfg.hidden_dim}; "
                          f"use a process count that divides both it and the {cfg.n_kv_heads} KV heads")


def shard_linear(linear: nn.Linear, dim: int, rank: int, world: int) -> None:
    """Keep this rank's slice of ``linear`` in place: ``dim`` 0 splits the outputs (column-parallel),
    1 the inputs (row-parallel; a bias would be added once, so row-parallel layers must have none)."""
    w = linear.weight
    size = w.shape[dim] // world
    part = w.detach().narrow(dim, rank * size, size).clone()  # clone: the full tensor can be freed
    linear.weight = nn.Parameter(part, requires_grad=False)
    if dim == 0:
        linear.out_features = size
        if linear.bias is not None:
            bias = linear.bias.detach().narrow(0, rank * size, size).clone()
            linear.bias = nn.Parameter(bias, requires_grad=False)
    else:
        if linear.bias is not None:
            raise ConfigError("a row-parallel projection with a bias cannot be split (it would be added once per rank)")
        linear.in_features = size


@dataclass
class CommMeter:
    """Time spent inside the all_reduces of this rank, and in the forward passes around them.

    ``decode`` keeps (step_ns, all_reduce_ns) of every single-token forward since ``reset``, so the
    all_reduce share of each decode step can be reported as a distribution, not one mean."""

    sync: object = None  # called before each clock read (CUDA: torch.cuda.synchronize)
    allreduce_ns: int = 0
    allreduce_calls: int = 0
    allreduce_bytes: int = 0
    decode: list = field(default_factory=list)

    def reset(self) -> None:
        self.allreduce_ns = self.allreduce_calls = self.allreduce_bytes = 0
        self.decode = []

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        if self.sync is not None:
            self.sync()
        t0 = time.perf_counter_ns()
        dist.all_reduce(t)
        if self.sync is not None:
            self.sync()
        self.allreduce_ns += time.perf_counter_ns() - t0
        self.allreduce_calls += 1
        self.allreduce_bytes += t.numel() * t.element_size()
        return t

    def record_step(self, step_ns: int, allreduce_ns: int) -> None:
        if len(self.decode) < 100_000:  # bounded: a long chat must not grow it forever
            self.decode.append((step_ns, allreduce_ns))

    def summary(self) -> dict:
        """Per-rank figures of the single-token steps since ``reset``: the share (percent) of each
        step spent inside all_reduce, its median and spread, and the totals."""
        import statistics

        shares = [100.0 * a / s for s, a in self.decode if s > 0]
        return {"decode_steps": len(self.decode),
                "allreduce_pct": shares,
                "allreduce_pct_median": statistics.median(shares) if shares else float("nan"),
                "allreduce_pct_min": min(shares, default=float("nan")),
                "allreduce_pct_max": max(shares, default=float("nan")),
                "step_ms_median": statistics.median(s / 1e6 for s, _ in self.decode) if self.decode else float("nan"),
                "allreduce_ms_total": self.allreduce_ns / 1e6, "allreduce_calls": self.allreduce_calls,
                "allreduce_bytes": self.allreduce_bytes}


def shard_model(model, rank: int, world: int, meter: CommMeter | None = None, reduce=None) -> CommMeter:
    """Split ``model`` (a plain Transformer, dense weights) in place for ``rank`` of ``world``.

    The o and down projections get a forward hook that sums their partial outputs over the ranks
    (``reduce``, default ``meter.all_reduce``: torch.distributed's default group). ``model.config``
    becomes this rank's share (heads, KV heads, hidden size), which sizes its KV cache."""
    cfg = model.config
    check_tp(cfg, world)
    if model.decode_step is not None:
        raise ConfigError("tensor parallelism runs the plain model's forward; load it without "
                          "--compile/--fastpath (a decode step is set)")
    meter = meter or CommMeter()
    reduce = reduce or meter.all_reduce
    for block in model.layers:
        _shard_block(block, rank, world, reduce)
    model.config = cfg.with_(n_heads=cfg.n_heads // world, n_kv_heads=cfg.n_kv_heads // world,
                             hidden_dim=cfg.hidden_dim // world, head_dim=cfg.head_dim)
    model.tp_rank, model.tp_world = rank, world
    model.drop_cache()  # a cache sized for every head would be wrong now
    return meter


def _shard_block(block, rank: int, world: int, reduce) -> None:
    attn, mlp = block.attn, block.mlp
    for lin in (attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj):
        _check_plain(lin)
        shard_linear(lin, 0, rank, world)
    for lin in (attn.o_proj, mlp.down_proj):
        _check_plain(lin)
        shard_linear(lin, 1, rank, world)
        if world > 1:  # one rank holds the whole sum: N=1 stays the plain model, the baseline
            lin.register_forward_hook(lambda _m, _inp, out: reduce(out))
    attn.n_heads //= world
    attn.n_kv //= world


def _check_plain(lin) -> None:
    if type(lin) is not nn.Linear or lin.weight.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ConfigError(f"tensor parallelism splits dense nn.Linear weights; found {type(lin).__name__} "
                          f"({getattr(getattr(lin, 'weight', None), 'dtype', '?')}): load with --fastpath off "
                          f"and without --quantize")
