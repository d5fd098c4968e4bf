"""A loaded model run tensor-parallel over the ranks of engine.distributed.launch: rank 0 drives.

Rank 0 runs the ordinary command (generate, chat, bench llm) on an ordinary LoadedModel whose
Transformer is sharded (engine.distributed.tp); a forward pre-hook broadcasts each call's inputs
(token ids, start position, cache shape) to the other ranks, which run the same forward on their
shards and meet rank 0 in its all_reduces. So sampling, stop strings, the prefix cache and the
benchmark runner's adaptive repetitions need no change: only rank 0 decides, the followers mirror.
The followers skip the output head (logits are needed only where tokens are sampled).

The messages are torch.distributed broadcasts in the job's own process group, nothing else.
"""
from __future__ import annotations

import logging
import os
import signal
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn as nn

from opscope.engine.errors import ConfigError, DeviceError, EngineError

log = logging.getLogger(__name__)

OP_STOP, OP_FORWARD, OP_METER_RESET, OP_METER_READ = 0, 1, 2, 3
_HEADER = 8  # op, B, T, start, last_only, has_pad, cache batch, cache length
# Each rank's whole run and each collective are bounded (engine.distributed.launch): a dead rank is
# seen at once (its sockets close, the agent stops the others); these bound a hung one.
GENERATE_TIMEOUT_S = 3600.0
CHAT_TIMEOUT_S = 7 * 24 * 3600.0  # a chat waits on its user between replies
BENCH_TIMEOUT_S = 6 * 3600.0
DIE_ENV = "OPSCOPE_TP_DIE_AT"  # "RANK:STEP" (tests): that rank exits abruptly at its STEP-th forward


@dataclass(frozen=True)
class TPJob:
    """What every rank loads (dense weights: the plain torch model) and how the job is launched."""

    model: str | None = None
    device: str = "cpu"
    dtype: str = "float32"
    attention: str = "sdpa"
    threads: int | None = None
    nproc: int = 2
    timeout_s: float = 600.0
    stdin_path: str | None = None  # rank 0 reads the user's input from here (chat)


def job_from_args(args, timeout_s: float = 600.0, stdin: bool = False) -> TPJob:
    """A TPJob from the model flags of generate/chat/bench; one line for what cannot run split."""
    if getattr(args, "backend", "torch") not in (None, "torch"):
        raise ConfigError(f"--nproc runs the torch backend's plain model; --backend {args.backend} cannot be split")
    if getattr(args, "compile", "off") != "off" or getattr(args, "quantize", "off") != "off":
        raise ConfigError("--nproc splits the dense float32/bfloat16 weights of the plain model; "
                          "drop --compile/--quantize (they stay single-process)")
    fast = getattr(args, "fastpath", "auto") or "auto"
    if fast not in ("auto", "off", "dense", "none"):
        raise ConfigError(f"--nproc with --fastpath {fast}: the quantized fast path stays single-process; "
                          f"tensor parallelism loads dense weights (use --fastpath off or leave it out)")
    if fast == "auto":
        log.info("--nproc: the quantized fast path stays single-process; each rank loads dense weights")
    if getattr(args, "nnodes", 1) > 1:
        raise ConfigError(f"--nnodes {args.nnodes}: tensor-parallel decode runs on one node (--nproc ranks); "
                          f"several nodes are for `opscope bench collectives`")
    timeout_s = getattr(args, "dist_timeout_s", None) or timeout_s
    device = str(args.device)
    if args.nproc > 1 and device.startswith("cuda:"):
        raise ConfigError(f"--device {device} with --nproc {args.nproc}: give --device cuda; rank r uses cuda:r")
    stdin_path = f"/proc/{os.getpid()}/fd/0" if stdin else None
    return TPJob(args.model, device, args.dtype, args.attention, args.threads, args.nproc, timeout_s, stdin_path)


def run_tp(job: TPJob, task: Callable, *task_args) -> Any:
    """Launch ``job.nproc`` ranks; rank 0 runs ``task(lm, *task_args)`` on the tensor-parallel model.
    Returns rank 0's result; an EngineError raised there is raised here (one line)."""
    from opscope.engine.distributed.launch import LaunchSpec, launch
    from opscope.engine.distributed.tp import check_tp
    from opscope.engine.formats import open_model

    check_tp(open_model(job.model).config, job.nproc)  # a bad split fails here, before any rank starts
    backend = "nccl" if job.device.startswith("cuda") else "gloo"
    if backend == "nccl" and torch.cuda.device_count() < job.nproc:
        raise DeviceError(f"--nproc {job.nproc} on --device cuda needs {job.nproc} GPUs, one per rank; "
                          f"{torch.cuda.device_count()} visible: lower --nproc")
    results = launch(LaunchSpec(nproc=job.nproc, backend=backend, timeout_s=job.timeout_s), tp_main, job, task,
                     task_args)
    out = results.get(0)
    if isinstance(out, BaseException):
        raise out
    return out


def tp_main(job: TPJob, task: Callable, task_args: tuple) -> Any:
    """Every rank: load, shard, then rank 0 runs ``task`` and the others follow until it stops."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    lm, meter = load_sharded(job, rank, world)
    if rank != 0:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is rank 0's to handle
        follow(lm.model, meter)
        return meter.summary()
    driver = Driver(lm.model, meter)
    if job.stdin_path:
        _reopen_stdin(job.stdin_path)
    try:
        result = task(_as_tensor_parallel(lm, driver), *task_args)
    except EngineError as e:  # the user's error, raised again by the parent as it is
        result = e
    # Anything else (Ctrl-C, a bug) may have left a forward half-done: no STOP then; the followers
    # fail on the closed connection when this rank exits and the launcher names this rank's error.
    driver.stop()
    return result


def load_sharded(job: TPJob, rank: int, world: int):
    """This rank's LoadedModel (plain torch model, dense weights) split for tensor parallelism."""
    from opscope.engine.distributed.tp import CommMeter, shard_model
    from opscope.engine.loaded import load_plain

    device = f"cuda:{int(os.environ.get('LOCAL_RANK', rank))}" if job.device.startswith("cuda") else job.device
    threads = job.threads or max(1, (os.cpu_count() or 1) // world)  # the ranks share the machine's cores
    lm = load_plain(job.model, device=device, dtype=job.dtype, attention=job.attention, threads=threads)
    sync = (lambda: torch.cuda.synchronize(lm.device)) if lm.device.type == "cuda" else None
    meter = shard_model(lm.model, rank, world, CommMeter(sync=sync))
    if rank != 0:
        lm.model.lm_head = _NoHead()  # only rank 0 samples: the followers' logits would be discarded
    return lm, meter


class _NoHead(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[..., :0]


def _as_tensor_parallel(lm, driver: "Driver"):
    """Rank 0's LoadedModel, unchanged but for ``tp`` (the driver: meters) and describe() naming
    the split (saved with bench runs, printed by generate --json)."""
    lm.tp = driver
    lm.backend_name = f"torch-tp{driver.world}"
    describe = lm.describe
    lm.describe = lambda: {**describe(), "nproc": driver.world, "tensor_parallel": True}
    return lm


def _header(device, *fields: int) -> torch.Tensor:
    h = torch.zeros(_HEADER, dtype=torch.long)
    h[:len(fields)] = torch.tensor(fields, dtype=torch.long)
    return h.to(device)


def _cache_shape(model) -> tuple[int, int]:
    cache = model.layers[0].attn.cache
    return (cache.k.shape[0], cache.k.shape[1]) if cache is not None else (0, 0)


class Driver:
    """Rank 0: broadcasts each forward's inputs before running it; times single-token steps."""

    def __init__(self, model, meter):
        import torch.distributed as dist

        self.model, self.meter, self.world = model, meter, dist.get_world_size()
        self.device = model.embed.weight.device if dist.get_backend() == "nccl" else torch.device("cpu")
        self.stopped = False
        self._t0 = self._ar0 = 0
        self._hooks = [model.register_forward_pre_hook(self._before, with_kwargs=True),
                       model.register_forward_hook(self._after)]

    def _before(self, model, args, kwargs):
        import torch.distributed as dist

        idx = args[0]
        start = args[1] if len(args) > 1 else kwargs.get("input_pos", 0)
        start = int(start[0]) if isinstance(start, torch.Tensor) else int(start)
        pad, last_only = kwargs.get("pad"), bool(kwargs.get("last_only", False))
        B, T = idx.shape
        self._t0, self._ar0 = time.perf_counter_ns(), self.meter.allreduce_ns
        dist.broadcast(_header(self.device, OP_FORWARD, B, T, start, int(last_only), int(pad is not None),
                               *_cache_shape(model)), 0)
        dist.broadcast(idx.to(self.device, torch.long).contiguous(), 0)
        if pad is not None:
            dist.broadcast(pad.to(self.device, torch.long).contiguous(), 0)

    def _after(self, model, args, out):
        if args[0].shape[1] == 1:
            if self.meter.sync is not None:
                self.meter.sync()
            self.meter.record_step(time.perf_counter_ns() - self._t0, self.meter.allreduce_ns - self._ar0)

    def reset_meters(self) -> None:
        import torch.distributed as dist

        dist.broadcast(_header(self.device, OP_METER_RESET), 0)
        self.meter.reset()

    def read_meters(self) -> list[dict]:
        """Every rank's CommMeter.summary(), rank order."""
        import torch.distributed as dist

        dist.broadcast(_header(self.device, OP_METER_READ), 0)
        out = [None] * self.world
        dist.gather_object(self.meter.summary(), out, dst=0)
        return out

    def stop(self) -> None:
        import torch.distributed as dist

        if not self.stopped:
            self.stopped = True
            for h in self._hooks:
                h.remove()
            dist.broadcast(_header(self.device, OP_STOP), 0)


def follow(model, meter) -> None:
    """Ranks other than 0: run the forwards rank 0 announces until it says stop."""
    import torch.distributed as dist

    device = model.embed.weight.device if dist.get_backend() == "nccl" else torch.device("cpu")
    die_at = _die_step()
    n = 0
    with torch.inference_mode():
        while True:
            h = _header(device)
            dist.broadcast(h, 0)
            op, B, T, start, last_only, has_pad, cache_b, cache_len = h.tolist()
            if op == OP_STOP:
                return
            if op == OP_METER_RESET:
                meter.reset()
            elif op == OP_METER_READ:
                dist.gather_object(meter.summary(), None, dst=0)
            elif op == OP_FORWARD:
                n += 1
                if n == die_at:
                    os._exit(3)  # a rank that dies mid-decode (tests)
                _follow_forward(model, meter, device, (B, T, start, last_only, has_pad, cache_b, cache_len))


def _follow_forward(model, meter, device, fields) -> None:
    import torch.distributed as dist

    B, T, start, last_only, has_pad, cache_b, cache_len = fields
    idx = torch.empty(B, T, dtype=torch.long, device=device)
    dist.broadcast(idx, 0)
    pad = None
    if has_pad:
        pad = torch.empty(B, dtype=torch.long, device=device)
        dist.broadcast(pad, 0)
    dev = model.embed.weight.device
    t0, ar0 = time.perf_counter_ns(), meter.allreduce_ns
    with _matching_cache(model, cache_b, cache_len):
        model(idx.to(dev), start, pad=None if pad is None else pad.to(dev), last_only=bool(last_only))
    if T == 1:
        if meter.sync is not None:
            meter.sync()
        meter.record_step(time.perf_counter_ns() - t0, meter.allreduce_ns - ar0)


class _matching_cache:
    """The follower's KV cache shaped as rank 0's: (0, 0) = a forward without a cache (rank 0's
    ``logits()``), kept aside meanwhile; a new shape keeps the positions both share (rank 0 keeps
    a reused prefix on growth; stale positions past it are overwritten before they are read)."""

    def __init__(self, model, batch: int, length: int):
        self.model, self.batch, self.length, self.saved = model, batch, length, None

    def __enter__(self):
        m = self.model
        if self.length == 0:
            self.saved = ([layer.attn.cache for layer in m.layers], m.max_cache_len)
            m.drop_cache()
        elif _cache_shape(m) != (self.batch, self.length):
            old = [layer.attn.cache for layer in m.layers]
            m.setup_cache(self.batch, self.length)
            for layer, c in zip(m.layers, old):
                if c is not None:
                    b, s = min(c.k.shape[0], self.batch), min(c.k.shape[1], self.length)
                    layer.attn.cache.k[:b, :s] = c.k[:b, :s]
                    layer.attn.cache.v[:b, :s] = c.v[:b, :s]

    def __exit__(self, *exc):
        if self.saved is not None:
            caches, length = self.saved
            for layer, c in zip(self.model.layers, caches):
                layer.attn.cache = c
            self.model.max_cache_len = length


def _die_step() -> int:
    import torch.distributed as dist

    spec = os.environ.get(DIE_ENV, "")
    rank, _, step = spec.partition(":")
    return int(step) if spec and int(rank) == dist.get_rank() else -1


def _reopen_stdin(path: str) -> None:
    """The spawned rank's stdin is /dev/null; chat reads the user's terminal or pipe through the
    launching process's fd 0."""
    import sys

    try:
        sys.stdin = open(path, encoding="utf-8", errors="strict")
    except OSError as e:
        raise ConfigError(f"--nproc chat: cannot read the terminal through {path} ({e.strerror}); "
                          f"chat with --nproc needs Linux's /proc") from e
