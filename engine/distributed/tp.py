"""Tensor-parallel Llama-family decode: Megatron's split of each block over the ranks of a group.

Per block (gpt-fast's tp.py scheme): q/k/v and gate/up are column-parallel (each rank keeps the
output rows of its heads / its slice of the hidden dim), o and down are row-parallel (the matching
input columns) and their partial outputs are summed by one ``all_reduce`` each: two per block per
forward. Query and KV heads are split alike, so a rank's query heads use exactly its own KV heads
(GQA groups never straddle ranks) and each rank's KV cache holds only its heads. The embedding,
the norms and the output head stay whole on every rank (dense float32 weights).

``shard_model`` works in place on the plain torch model (engine.models.llama.Transformer) as
loaded: weights are sliced per rank, the rest freed. ``CommMeter`` records every forward and every
all_reduce as a span, so a decode step's communication share is read from the same spans the
per-rank trace shows.
"""

from __future__ import annotations

import time
from array import array
from bisect import bisect_left

import torch
import torch.nn as nn
from opscope.engine.core.errors import ConfigError

__all__ = ["CommMeter", "check_tp", "shard_model", "shard_linear"]


def check_tp(cfg, world: int) -> None:
    """One ConfigError line if ``cfg`` (a ModelConfig) cannot be split over ``world`` ranks."""
    if world < 1:
        raise ConfigError(f"--nproc {world}: give at least 1 process")
    if cfg.n_kv_heads % world:
        raise ConfigError(
            f"--nproc {world} does not divide the model's {cfg.n_kv_heads} KV heads "
            f"({cfg.n_heads} query heads): tensor parallelism splits whole KV heads, use --nproc "
            f"{' or '.join(str(n) for n in range(1, cfg.n_kv_heads + 1) if cfg.n_kv_heads % n == 0)}"
        )
    if cfg.hidden_dim % world:
        raise ConfigError(
            f"--nproc {world} does not divide the model's MLP hidden size {cfg.hidden_dim}; "
            f"use a process count that divides both it and the {cfg.n_kv_heads} KV heads"
        )


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


class CommMeter:
    """Every forward pass and every all_reduce of this rank, as spans on the engine's clock.

    The spans are the one record: the all_reduce share of each decode step (``summary``), the
    per-rank Perfetto trace and the run's rank markers (engine.distributed.ranks) all read them, so
    a figure and the trace cannot disagree. A forward is (start, end, tokens); an all_reduce is
    (start, end, bytes). ``reset`` opens a new window (the share of a benchmark repetition is its
    steps only); ``clear`` forgets everything. Spans live in flat int64 arrays (24 B each); past
    ``max_spans`` the oldest half is dropped, so a long chat cannot grow them forever."""

    def __init__(self, sync=None, max_spans: int = 1_000_000):
        self.sync = sync  # called before each clock read (CUDA: torch.cuda.synchronize)
        self.max_spans = max_spans
        self.clear()

    def clear(self) -> None:
        self.fwd = (array("q"), array("q"), array("q"))  # start_ns, end_ns, tokens
        self.ar = (array("q"), array("q"), array("q"))  # start_ns, end_ns, bytes
        self.window = 0  # index of the window's first forward
        self.dropped = 0  # forwards dropped past max_spans
        self._open: int | None = None

    def reset(self) -> None:
        self.window = len(self.fwd[0])

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        if self.sync is not None:
            self.sync()
        t0 = time.monotonic_ns()
        dist.all_reduce(t)
        if self.sync is not None:
            self.sync()
        _append(self.ar, t0, time.monotonic_ns(), t.numel() * t.element_size())
        return t

    def begin_forward(self) -> None:
        self._open = time.monotonic_ns()

    def end_forward(self, tokens: int) -> None:
        if self._open is None:
            return
        if self.sync is not None:
            self.sync()
        _append(self.fwd, self._open, time.monotonic_ns(), tokens)
        self._open = None
        if len(self.ar[0]) + len(self.fwd[0]) > self.max_spans:
            self._drop_oldest_half()

    def _drop_oldest_half(self) -> None:
        n = len(self.fwd[0]) // 2
        cut = self.fwd[0][n] if n < len(self.fwd[0]) else (1 << 62)
        k = bisect_left(self.ar[0], cut)  # spans are appended in time order
        for a in self.fwd:
            del a[:n]
        for a in self.ar:
            del a[:k]
        self.window, self.dropped = max(0, self.window - n), self.dropped + n

    def spans(self, since: int = 0) -> dict:
        """Plain lists (picklable): forwards from index ``since`` and the all_reduces inside them."""
        fs, fe, ft = (a[since:].tolist() for a in self.fwd)
        i = bisect_left(self.ar[0], fs[0]) if fs else len(self.ar[0])
        return {
            "forwards": list(zip(fs, fe, ft)),
            "all_reduces": list(zip(*(a[i:].tolist() for a in self.ar))),
            "dropped": self.dropped,
        }

    def summary(self) -> dict:
        """This window's single-token forwards (decode steps): the share (percent) of each spent
        inside all_reduce, from the spans (engine.distributed.ranks.decode_steps), and the totals."""
        import statistics

        from opscope.engine.distributed.ranks import decode_steps

        sp = self.spans(self.window)
        steps = decode_steps(sp)
        shares = [s["allreduce_pct"] for s in steps]
        return {
            "decode_steps": len(steps),
            "allreduce_pct": shares,
            "allreduce_pct_median": statistics.median(shares) if shares else float("nan"),
            "allreduce_pct_min": min(shares, default=float("nan")),
            "allreduce_pct_max": max(shares, default=float("nan")),
            "step_ms_median": statistics.median(s["step_ns"] / 1e6 for s in steps) if steps else float("nan"),
            "allreduce_ms_total": sum(e - s for s, e, _ in sp["all_reduces"]) / 1e6,
            "allreduce_calls": len(sp["all_reduces"]),
            "allreduce_bytes": sum(b for _, _, b in sp["all_reduces"]),
        }


def _append(arrays, *values) -> None:
    for a, v in zip(arrays, values):
        a.append(v)


def shard_model(model, rank: int, world: int, meter: CommMeter | None = None, reduce=None) -> CommMeter:
    """Split ``model`` (a plain Transformer, dense weights) in place for ``rank`` of ``world``.

    The o and down projections get a forward hook that sums their partial outputs over the ranks
    (``reduce``, default ``meter.all_reduce``: torch.distributed's default group). ``model.config``
    becomes this rank's share (heads, KV heads, hidden size), which sizes its KV cache."""
    cfg = model.config
    check_tp(cfg, world)
    if model.decode_step is not None:
        raise ConfigError(
            "tensor parallelism runs the plain model's forward; load it without "
            "--compile/--fastpath (a decode step is set)"
        )
    meter = meter or CommMeter()
    reduce = reduce or meter.all_reduce
    for block in model.layers:
        _shard_block(block, rank, world, reduce)
    model.config = cfg.with_(
        n_heads=cfg.n_heads // world,
        n_kv_heads=cfg.n_kv_heads // world,
        hidden_dim=cfg.hidden_dim // world,
        head_dim=cfg.head_dim,
    )
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
        raise ConfigError(
            f"tensor parallelism splits dense nn.Linear weights; found {type(lin).__name__} "
            f"({getattr(getattr(lin, 'weight', None), 'dtype', '?')}): load with --fastpath off "
            f"and without --quantize"
        )
