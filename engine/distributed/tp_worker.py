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
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from opscope.engine.core.errors import Cancelled, ConfigError, DeviceError, EngineError, Terminated
from opscope.engine.core.results import Marker

log = logging.getLogger(__name__)

OP_STOP, OP_FORWARD, OP_METER_RESET, OP_METER_READ, OP_SPANS_READ, OP_SPANS_CLEAR = 0, 1, 2, 3, 4, 5
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
    parent_pid: int | None = None  # rank 0 writes to this process's stdout and stderr (where they are now)


def job_from_args(args, timeout_s: float = 600.0, stdin: bool = False) -> TPJob:
    """A TPJob from the model flags of generate/chat/bench; one line for what cannot run split."""
    if getattr(args, "backend", "torch") not in (None, "torch"):
        raise ConfigError(f"--nproc runs the torch backend's plain model; --backend {args.backend} cannot be split")
    if getattr(args, "compile", "off") != "off" or getattr(args, "quantize", "off") != "off":
        raise ConfigError(
            "--nproc splits the dense float32/bfloat16 weights of the plain model; "
            "drop --compile/--quantize (they stay single-process)"
        )
    fast = getattr(args, "fastpath", "auto") or "auto"
    if fast not in ("auto", "off", "dense", "none"):
        raise ConfigError(
            f"--nproc with --fastpath {fast}: the quantized fast path stays single-process; "
            f"tensor parallelism loads dense weights (use --fastpath off or leave it out)"
        )
    if fast == "auto":
        log.info("--nproc: the quantized fast path stays single-process; each rank loads dense weights")
    if getattr(args, "nnodes", 1) > 1:
        raise ConfigError(
            f"--nnodes {args.nnodes}: tensor-parallel decode runs on one node (--nproc ranks); "
            f"several nodes are for `opscope bench collectives`"
        )
    timeout_s = getattr(args, "dist_timeout_s", None) or timeout_s
    device = str(args.device)
    if args.nproc > 1 and device.startswith("cuda:"):
        raise ConfigError(f"--device {device} with --nproc {args.nproc}: give --device cuda; rank r uses cuda:r")
    stdin_path = f"/proc/{os.getpid()}/fd/0" if stdin else None
    return TPJob(
        args.model, device, args.dtype, args.attention, args.threads, args.nproc, timeout_s, stdin_path, os.getpid()
    )


def run_tp(job: TPJob, task: Callable, *task_args) -> Any:
    """Launch ``job.nproc`` ranks; rank 0 runs ``task(lm, *task_args)`` on the tensor-parallel model.
    Returns rank 0's result; an EngineError raised there is raised here (one line)."""
    from opscope.engine.distributed.launch import LaunchSpec, launch
    from opscope.engine.distributed.tp import check_tp
    from opscope.engine.formats import open_model

    check_tp(open_model(job.model).config, job.nproc)  # a bad split fails here, before any rank starts
    backend = "nccl" if job.device.startswith("cuda") else "gloo"
    if backend == "nccl" and torch.cuda.device_count() < job.nproc:
        raise DeviceError(
            f"--nproc {job.nproc} on --device cuda needs {job.nproc} GPUs, one per rank; "
            f"{torch.cuda.device_count()} visible: lower --nproc"
        )
    spec = LaunchSpec(
        nproc=job.nproc, backend=backend, timeout_s=job.timeout_s, rank0_takes_sigint=job.stdin_path is not None
    )  # the chat: Ctrl-C stops a reply
    results = launch(spec, tp_main, job, task, task_args)
    out = results.get(0)
    if isinstance(out, BaseException):
        raise out
    return out


def tp_main(job: TPJob, task: Callable, task_args: tuple) -> Any:
    """Every rank: load, shard, then rank 0 runs ``task`` and the others follow until it stops."""
    import torch.distributed as dist
    from opscope.engine.distributed.ranks import clock_alignment

    rank, world = dist.get_rank(), dist.get_world_size()
    lm, meter = load_sharded(job, rank, world)
    meter.offset_ns = clock_alignment(torch, dist, None)["offset_ns"]  # onto rank 0's clock
    if rank != 0:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is rank 0's to handle
        follow(lm.model, meter)
        return meter.summary()
    driver = Driver(lm.model, meter)
    if job.parent_pid:
        _write_where_the_parent_writes(job.parent_pid)
    if job.stdin_path:
        _reopen_stdin(job.stdin_path)
        driver.take_sigint()
    else:  # SIGTERM (the launcher's, passed on by the agent): close what is open (a bench run) as on Ctrl-C
        signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        result = task(_as_tensor_parallel(lm, driver), *task_args)
    except EngineError as e:  # the user's error, raised again by the parent as it is
        if isinstance(e, Cancelled) and not driver.sigint_taken:
            return e  # a bench closed as aborted on SIGTERM: the agent is stopping every rank
        result = e
    except KeyboardInterrupt as e:
        if not driver.sigint_taken or isinstance(e, Terminated):
            return Cancelled("stopped")  # the agent is stopping every rank already
        # the chat's Ctrl-C at the prompt, raised between forwards: every rank stops cleanly
        result = Cancelled("chat ended by Ctrl-C; every rank stopped")
    # Anything else (a bug) may have left a forward half-done: no STOP then; the followers fail on
    # the closed connection when this rank exits and the launcher names this rank's error.
    driver.stop()
    return result


def load_sharded(job: TPJob, rank: int, world: int):
    """This rank's LoadedModel (plain torch model, dense weights) split for tensor parallelism."""
    from opscope.engine.distributed.tp import CommMeter, shard_model
    from opscope.engine.generation.loaded import load_plain

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


def _as_tensor_parallel(lm, driver: Driver):
    """Rank 0's LoadedModel, unchanged but for ``tp`` (the driver: meters) and describe() naming
    the split (saved with bench runs, printed by generate --json)."""
    lm.tp = driver
    lm.backend_name = f"torch-tp{driver.world}"
    describe = lm.describe
    lm.describe = lambda: {**describe(), "nproc": driver.world, "tensor_parallel": True}
    return lm


def _header(device, *fields: int) -> torch.Tensor:
    h = torch.zeros(_HEADER, dtype=torch.long)
    h[: len(fields)] = torch.tensor(fields, dtype=torch.long)
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
        self.sigint_taken = self.in_forward = self.sigint_pending = False
        self._hooks = [
            model.register_forward_pre_hook(self._before, with_kwargs=True),
            model.register_forward_hook(self._after),
        ]

    def _before(self, model, args, kwargs):
        import torch.distributed as dist

        idx = args[0]
        start = args[1] if len(args) > 1 else kwargs.get("input_pos", 0)
        start = int(start[0]) if isinstance(start, torch.Tensor) else int(start)
        pad, last_only = kwargs.get("pad"), bool(kwargs.get("last_only", False))
        B, T = idx.shape
        self.in_forward = True  # from here a Ctrl-C waits for the forward's end (take_sigint)
        self.meter.begin_forward()  # rank 0's step includes sending the inputs
        dist.broadcast(
            _header(self.device, OP_FORWARD, B, T, start, int(last_only), int(pad is not None), *_cache_shape(model)), 0
        )
        dist.broadcast(idx.to(self.device, torch.long).contiguous(), 0)
        if pad is not None:
            dist.broadcast(pad.to(self.device, torch.long).contiguous(), 0)

    def _after(self, model, args, out):
        self.meter.end_forward(int(args[0].shape[1]))
        self.in_forward = False
        if self.sigint_pending:
            self.sigint_pending = False
            raise KeyboardInterrupt  # every rank has finished this forward: stopping here is clean

    def take_sigint(self) -> None:
        """Ctrl-C on rank 0 (the chat): raised between forwards, never inside one, where the
        other ranks would wait in its all_reduce; a Ctrl-C during a forward is raised at its end.
        A second one while a forward is still running (a rank stuck) ends this rank."""
        from opscope.engine.distributed.launch import sigint_taken

        signal.signal(signal.SIGINT, self._on_sigint)
        self.sigint_taken = True
        sigint_taken()

    def _on_sigint(self, _signum, _frame) -> None:
        if not self.in_forward:
            raise KeyboardInterrupt
        if self.sigint_pending:
            os._exit(130)
        self.sigint_pending = True

    def reset_meters(self) -> None:
        import torch.distributed as dist

        dist.broadcast(_header(self.device, OP_METER_RESET), 0)
        self.meter.reset()

    def read_meters(self) -> list[dict]:
        """Every rank's CommMeter.summary(), rank order."""
        import torch.distributed as dist

        dist.broadcast(_header(self.device, OP_METER_READ), 0)
        out: list[dict] = [{} for _ in range(self.world)]  # filled by the gather
        dist.gather_object(self.meter.summary(), out, dst=0)
        return out

    def read_spans(self) -> dict[int, dict]:
        """Every rank's spans since the last clear, on rank 0's clock: {rank: CommMeter.spans()
        with "offset_ns"} (engine.distributed.ranks reads them)."""
        import torch.distributed as dist

        dist.broadcast(_header(self.device, OP_SPANS_READ), 0)
        out: list[dict] = [{} for _ in range(self.world)]  # filled by the gather
        dist.gather_object(_own_spans(self.meter), out, dst=0)
        return dict(enumerate(out))

    def clear_spans(self) -> None:
        import torch.distributed as dist

        dist.broadcast(_header(self.device, OP_SPANS_CLEAR), 0)
        self.meter.clear()

    def report(self, out, trace_out=None) -> None:
        """The ranks' all_reduce share and imbalance (engine.distributed.ranks.tp_report) and,
        given a path, the per-rank Perfetto trace of the same spans."""
        import torch.distributed as dist
        from opscope.engine.distributed.ranks import tp_report, write_tp_trace

        spans = self.read_spans()
        for line in tp_report(spans, dist.get_backend()):
            out.write(line + "\n")
        if trace_out:
            path = write_tp_trace(spans, trace_out)
            out.write(f"per-rank trace: {path} (open in ui.perfetto.dev: one process per rank)\n")

    def recorder(self, inner=None) -> SpanRecorder:
        return SpanRecorder(self, inner)

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
            elif op == OP_SPANS_READ:
                dist.gather_object(_own_spans(meter), None, dst=0)
            elif op == OP_SPANS_CLEAR:
                meter.clear()
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
    meter.begin_forward()
    with _matching_cache(model, cache_b, cache_len):
        model(idx.to(dev), start, pad=None if pad is None else pad.to(dev), last_only=bool(last_only))
    meter.end_forward(T)


def _own_spans(meter) -> dict:
    return {**meter.spans(), "offset_ns": getattr(meter, "offset_ns", 0)}


class SpanRecorder:
    """A benchmark run's recorder (engine.bench.session's ``recorder``) on rank 0: the ranks' spans
    start empty with the measurement and end up as the run's rank markers (forwards and
    all_reduces, engine.distributed.ranks.tp_markers), with any telemetry recorder's own."""

    def __init__(self, driver: Driver, inner=None):
        self.driver, self.inner = driver, inner
        self.markers: list[Marker] = []

    def start(self):
        self.driver.clear_spans()
        if self.inner is not None:
            self.inner.start()
        return self

    def stop(self):
        from opscope.engine.distributed.ranks import tp_markers

        if self.inner is not None:
            self.inner.stop()
        if sys.exc_info()[0] is not None:  # stopped mid-step (Ctrl-C, a rank gone): no collective now
            return self
        try:
            self.markers = tp_markers(self.driver.read_spans())
        except Exception as e:  # the run was stopped mid-step (a rank gone): the run is kept without them
            log.info("the ranks' spans could not be read (%s); the run is saved without rank markers", e)
        return self

    def attach(self, run):
        if self.inner is not None:
            self.inner.attach(run)
        else:
            run.telemetry, run.markers = [], []
        run.markers = sorted(list(run.markers) + self.markers, key=lambda m: m.t_ns)
        return run


class _matching_cache:
    """The follower's KV cache shaped as rank 0's: (0, 0) = a forward without a cache (rank 0's
    ``logits()``), kept aside meanwhile; a new shape keeps the positions both share (rank 0 keeps
    a reused prefix on growth; stale positions past it are overwritten before they are read)."""

    def __init__(self, model, batch: int, length: int):
        self.model, self.batch, self.length = model, batch, length
        self.saved: tuple[list, int] | None = None

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


def _raise_terminated(_signum, _frame) -> None:
    raise Terminated()


def _write_where_the_parent_writes(pid: int) -> None:
    """Rank 0 inherits the forkserver's stdout/stderr, which may be older than the caller's (a
    forkserver started by an earlier launch, under other redirections): write to the caller's own.
    Where both are the same file the inherited descriptor is kept: it shares the caller's offset."""
    for fd, stream in ((1, sys.stdout), (2, sys.stderr)):
        path = f"/proc/{pid}/fd/{fd}"
        try:
            theirs, mine = os.stat(path), os.fstat(fd)
            if (theirs.st_dev, theirs.st_ino) == (mine.st_dev, mine.st_ino):
                continue
            target = os.open(path, os.O_WRONLY | os.O_APPEND)
        except OSError:  # a socket, a closed fd, no /proc: keep the inherited one
            continue
        if stream is not None:
            stream.flush()
        os.dup2(target, fd)
        os.close(target)


def _reopen_stdin(path: str) -> None:
    """The spawned rank's stdin is /dev/null; chat reads the user's terminal or pipe through the
    launching process's fd 0."""
    import sys

    try:
        sys.stdin = open(path, encoding="utf-8", errors="strict")
    except OSError as e:
        raise ConfigError(
            f"--nproc chat: cannot read the terminal through {path} ({e.strerror}); "
            f"chat with --nproc needs Linux's /proc"
        ) from e
