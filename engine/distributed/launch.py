"""Start N ranks through torch's own launcher and give back what each rank returned.

``launch(spec, fn, *args)`` runs ``fn(*args)`` in ``spec.nproc`` fresh processes per node through
``torch.distributed.launcher.api.elastic_launch`` (the elastic agent behind ``torchrun``): the agent
spawns the ranks, sets RANK/WORLD_SIZE/MASTER_ADDR…, watches them, stops every rank as soon as one
fails and hands back each rank's return value. ``launch`` wraps ``fn`` so it runs *inside an
initialised process group* (``init_rank`` is called before it, the group destroyed after): an
entrypoint never calls ``init_process_group`` itself. ``init_rank`` is public for scripts started
by a plain ``torchrun``.

Nothing hangs: ``spec.timeout_s`` bounds the rendezvous, every collective (the process group's
timeout) and each rank's whole run (a watchdog thread in the rank). A rank that raises, dies or
runs past the timeout makes ``launch`` raise ``DistributedError`` with one line naming the rank and
the cause; the agent has stopped the other ranks by then.

Ranks are forked from one ``multiprocessing`` forkserver that imported torch once (the agent's
``start_method="forkserver"``): after the first launch in a process, starting ranks costs no torch
import. Each rank takes the caller's current environment (the forkserver may be older) and, when
OMP_NUM_THREADS is set (torchrun's agent sets 1 when the caller has none), that many torch threads.
``fn`` and its arguments cross a process boundary: ``fn`` must be a module-level function and its
arguments and return value picklable. ``launch`` returns this node's ranks only; gather across
nodes inside ``fn`` (engine.distributed.collectives.rank_sweep does).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import fields as dataclass_fields
from types import FrameType
from typing import Any

from opscope.engine.core.errors import Cancelled, ConfigError, DistributedError, Terminated

log = logging.getLogger(__name__)

# A watchdog's message starts with one of these, so the parent can tell the rank that hung from
# the ranks that were only waiting for it inside a collective.
_HUNG = "hung"
_WAITING = "waiting"
_WATCHDOG_EXIT = 75
_SHUTDOWN_S = 5


@dataclass(frozen=True)
class LaunchSpec:
    """How many ranks, where they meet, and how long anything may take.

    ``nproc`` ranks on this node; ``nnodes`` nodes in all, this one being ``node_rank``. With
    several nodes ``rdzv_endpoint`` ("host:port" of node 0) is required, as with torchrun's
    ``--master-addr/--master-port`` (static rendezvous: ranks are node_rank * nproc + local rank).
    ``backend`` None picks nccl when CUDA is available, gloo otherwise. ``timeout_s`` bounds the
    rendezvous, each collective and each rank's whole run."""

    nproc: int
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    backend: str | None = None
    timeout_s: float = 120.0
    rank0_takes_sigint: bool = False  # an interactive rank 0 answers Ctrl-C itself (see launch)

    def __post_init__(self):
        if self.nproc < 1:
            raise ConfigError(f"nproc {self.nproc}: give at least 1 process per node")
        if self.nnodes < 1 or not 0 <= self.node_rank < self.nnodes:
            raise ConfigError(f"node_rank {self.node_rank} of nnodes {self.nnodes}: node_rank must be in 0..nnodes-1")
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise ConfigError(f"nnodes {self.nnodes}: several nodes need --rdzv-endpoint HOST:PORT (node 0's address)")
        if self.backend not in (None, "gloo", "nccl"):
            raise ConfigError(
                f"backend {self.backend!r}: use 'gloo' or 'nccl' (or none for nccl on CUDA, gloo otherwise)"
            )
        if not self.timeout_s > 0:
            raise ConfigError(f"timeout_s {self.timeout_s}: give a positive number of seconds")

    @property
    def world_size(self) -> int:
        return self.nproc * self.nnodes

    def resolved_backend(self) -> str:
        if self.backend:
            return self.backend
        import torch

        return "nccl" if torch.cuda.is_available() else "gloo"


def launch(spec: LaunchSpec, entrypoint: Callable, *args) -> dict[int, Any]:
    """Run ``entrypoint(*args)`` on every rank of this node; {global rank: its return value}.

    Ctrl-C ends the job: the agent stops every rank (Cancelled). With ``spec.rank0_takes_sigint``
    (an interactive rank 0, the chat) the agent runs in a thread, so that it installs no handler of
    its own, and once rank 0 calls ``sigint_taken()`` this process ignores Ctrl-C: rank 0, in the
    same process group, gets it and decides (stop a reply, or end the job by returning)."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    _preload_forkserver()
    log_dir = tempfile.mkdtemp(prefix="opscope-ranks-")
    config = _launch_config(spec, DefaultLogsSpecs(log_dir=log_dir))
    env = dict(os.environ)
    try:
        with _quiet_agent():
            run = elastic_launch(config, _run_rank)
            if not spec.rank0_takes_sigint or threading.current_thread() is not threading.main_thread():
                return run(spec, entrypoint, args, env)
            env[_SIGINT_READY] = os.path.join(log_dir, "rank0-takes-sigint")
            return _run_beside(run, (spec, entrypoint, args, env), env[_SIGINT_READY])
    except ChildFailedError as e:
        raise DistributedError(_one_line(e, spec)) from None
    except Exception as e:
        if type(e).__name__ == "SignalException":
            raise Cancelled(f"distributed run stopped by signal {getattr(e, 'sigval', '?')}; all ranks stopped") from e
        raise DistributedError(
            f"distributed run of {spec.world_size} ranks failed before the ranks ran: {type(e).__name__}: {_first_line(str(e))}"
        ) from e
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)


_SIGINT_READY = "OPSCOPE_RANK0_TAKES_SIGINT"


def sigint_taken() -> None:
    """Rank 0 says it handles Ctrl-C from now on (launch with ``rank0_takes_sigint``)."""
    path = os.environ.get(_SIGINT_READY)
    if path:
        with open(path, "w"):
            pass


def _run_beside(run: Callable, args: tuple, ready_path: str):
    """``run(*args)`` (the agent) in a thread; Ctrl-C here before rank 0 has taken it over, or
    SIGTERM at any time, stops the ranks and is raised once the agent has seen them go."""
    box: dict[str, Any] = {}
    done = threading.Event()

    def agent():
        try:
            box["result"] = run(*args)
        except BaseException as e:  # handed to the caller's thread
            box["error"] = e
        finally:
            done.set()

    thread = threading.Thread(target=agent, name="opscope-agent", daemon=True)
    thread.start()
    stop: BaseException | None = None
    try:
        while not done.is_set():
            try:
                time.sleep(0.05)  # not thread.join: a Ctrl-C inside it marks a live thread stopped (3.11)
            except KeyboardInterrupt as e:  # SIGTERM (Terminated) too
                if isinstance(e, Terminated) or not os.path.exists(ready_path):
                    stop = e
                    _stop_ranks()
                # else: rank 0 got the same Ctrl-C and answers it
    finally:
        if not done.is_set():  # leaving for any other reason: no rank may outlive this process
            _stop_ranks()
            done.wait(_SHUTDOWN_S + 5)
    if stop is not None:
        raise Cancelled(
            "distributed run stopped by "
            + ("SIGTERM" if isinstance(stop, Terminated) else "Ctrl-C")
            + "; all ranks stopped"
        ) from stop
    if "error" in box:
        raise box["error"]
    return box["result"]


def _stop_ranks() -> None:
    """SIGTERM to every rank of this process (the forkserver's children; the agent sees them end)."""
    import psutil

    for child in psutil.Process().children(recursive=True):
        try:
            if child.ppid() != os.getpid():  # a rank, not the forkserver or resource tracker
                child.terminate()
        except psutil.Error:
            pass


def _preload_forkserver() -> None:
    """Ranks fork from one server that imported torch once, fresh (no threads, no CUDA): a launch
    then costs no torch import per rank, and the server is reused by every later launch.

    The server starts with SIGINT ignored: a Ctrl-C at the terminal reaches the whole process
    group, and without this one while the server still imports torch prints its traceback. The
    ranks inherit it; ``_run_rank`` gives them Python's handler back (the agent stops ranks with
    SIGINT, then SIGKILL), except for a chat, whose rank 0 takes Ctrl-C over itself."""
    import multiprocessing
    from multiprocessing import forkserver

    multiprocessing.get_context("forkserver").set_forkserver_preload(["torch", "torch.distributed", __name__])
    if threading.current_thread() is not threading.main_thread():
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # an ignored signal stays ignored across exec
    # A rank still in its gloo rendezvous when a Ctrl-C stops the launch wrote c10's 25-line
    # TCPStore warning (with its C++ frames) under our one line: the ranks' C++ log shows errors
    # only, unless the user chose a level. c10 reads it once, as the server imports torch.
    user_level = os.environ.get("TORCH_CPP_LOG_LEVEL")
    os.environ["TORCH_CPP_LOG_LEVEL"] = user_level or "ERROR"
    try:
        forkserver.ensure_running()
    finally:
        signal.signal(signal.SIGINT, previous)
        if user_level is None:
            del os.environ["TORCH_CPP_LOG_LEVEL"]


def _launch_config(spec: LaunchSpec, logs_specs):
    from torch.distributed.launcher.api import LaunchConfig

    timeout = max(1, int(round(spec.timeout_s)))
    if spec.rdzv_endpoint:  # torchrun's --master-addr/--node-rank: static rendezvous
        backend, endpoint, configs = "static", spec.rdzv_endpoint, {"rank": spec.node_rank, "timeout": timeout}
    else:  # torchrun --standalone
        backend, endpoint, configs = "c10d", "localhost:0", {"timeout": timeout}
    # How long a stopped rank gets before SIGKILL: torch 2.13 takes it; 2.11 (the first GPU machine's,
    # docs/gpu.md) refuses the keyword and always gives 30 s.
    newer = {"shutdown_timeout": _SHUTDOWN_S} if "shutdown_timeout" in _fields(LaunchConfig) else {}
    return LaunchConfig(
        min_nodes=spec.nnodes,
        max_nodes=spec.nnodes,
        nproc_per_node=spec.nproc,
        run_id=_run_id(spec),
        rdzv_backend=backend,
        rdzv_endpoint=endpoint,
        rdzv_configs=configs,
        max_restarts=0,
        monitor_interval=0.05,
        start_method="forkserver",
        logs_specs=logs_specs,
        **newer,
    )


def _fields(cls: type) -> set[str]:
    return {f.name for f in dataclass_fields(cls)}


def _run_id(spec: LaunchSpec) -> str:
    """Every node of one job must name the same run (the rendezvous keys live under it): derived
    from the endpoint they share; a run on one node gets a fresh one."""
    if spec.rdzv_endpoint:
        return "opscope-" + "".join(c if c.isalnum() else "-" for c in spec.rdzv_endpoint)
    return f"opscope-{uuid.uuid4().hex[:12]}"


class _quiet_agent:
    """The agent logs each failure as a multi-line table; the one line we raise says it all."""

    names = ("torch.distributed.elastic", "torch.distributed.launcher", "torch.multiprocessing")

    def __enter__(self):
        # torch's elastic loggers each set their own level (LOGLEVEL, default WARNING), so the parents'
        # level does not reach them: every one that exists is quietened (e.g. the agent's "Received 2
        # death signal, shutting down workers", printed before our own line on Ctrl-C)
        known = [n for n in logging.root.manager.loggerDict if n.startswith(self.names)]
        self.levels = [(logging.getLogger(n), logging.getLogger(n).level) for n in (*self.names, *known)]
        for logger, _ in self.levels:
            logger.setLevel(logging.CRITICAL)

    def __exit__(self, *exc):
        for logger, level in self.levels:
            logger.setLevel(level)


def _run_rank(spec: LaunchSpec, entrypoint: Callable, args: tuple, parent_env: dict[str, str]):
    """The function every rank runs: caller's environment, watchdog, process group, entrypoint."""
    import torch.distributed as dist

    _adopt_env(parent_env)
    if not spec.rank0_takes_sigint:  # the forkserver's SIG_IGN guarded its import only: the agent
        signal.signal(signal.SIGINT, signal.default_int_handler)  # stops the ranks with SIGINT first
    watchdog = _Watchdog(spec.timeout_s)
    watchdog.start()
    try:
        init_rank(spec)
        try:
            return entrypoint(*args)
        finally:
            dist.destroy_process_group()
    except Exception as e:
        where, waiting = _where(_innermost(e.__traceback__))
        if not waiting:
            raise
        # A peer's failure seen from inside a collective: marked, and held back a moment, so that the
        # peer's own error is the one the agent sees first and the one shown (this rank's watchdog
        # must not call the wait a hang of its own meanwhile).
        watchdog.cancel()
        time.sleep(_grace_s(spec.timeout_s))
        raise DistributedError(f"{_WAITING} in {where}: {type(e).__name__}: {_first_line(str(e))}") from e
    finally:
        watchdog.cancel()


# What the agent sets for each rank; everything else comes from the caller's environment as it is
# now (the forkserver the ranks fork from may have started under an older one).
_AGENT_KEYS = frozenset(
    "GROUP_RANK GROUP_WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE MASTER_ADDR MASTER_PORT RANK ROLE_NAME "
    "ROLE_RANK ROLE_WORLD_SIZE WORLD_SIZE TORCH_NCCL_ASYNC_ERROR_HANDLING".split()
)


def _adopt_env(parent_env: dict[str, str]) -> None:
    import torch

    for key, value in parent_env.items():
        if key not in _AGENT_KEYS and not key.startswith("TORCHELASTIC_"):
            os.environ[key] = value
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:  # torch read it once, in the forkserver
        torch.set_num_threads(int(threads))


def _grace_s(timeout_s: float) -> float:
    return min(5.0, 1.0 + 0.1 * timeout_s)


def _innermost(tb):
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame


def init_rank(spec: LaunchSpec) -> None:
    """Initialise this rank's process group from the launcher's environment (no-op if done).

    Sets the CUDA device to LOCAL_RANK for nccl; the group's timeout is ``spec.timeout_s``."""
    import datetime

    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return
    if "RANK" not in os.environ:
        raise DistributedError("init_rank: RANK is not set; start this process through launch() or torchrun")
    backend = spec.resolved_backend()
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=spec.timeout_s))


class _Watchdog:
    """Ends a rank that runs past its deadline, leaving the agent a message saying where it was."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.main = threading.main_thread().ident
        self.timer = threading.Timer(timeout_s, self._fire)
        self.timer.daemon = True

    def start(self):
        self.timer.start()

    def cancel(self):
        self.timer.cancel()

    def _fire(self):
        from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

        where, waiting = _where(sys._current_frames().get(self.main or 0))  # ident: None only before start
        if waiting:  # give the rank it waits for the first word (the agent stops everyone on the first failure)
            time.sleep(_grace_s(self.timeout_s))
        state = f"{_WAITING} in {where}" if waiting else f"{_HUNG} in {where}"
        err = DistributedError(f"{state}: no result after the {self.timeout_s:g} s timeout")
        ErrorHandler().record_exception(err)
        os._exit(_WATCHDOG_EXIT)


def _where(frame) -> tuple[str, bool]:
    """(innermost frame outside torch as 'file:line in func', whether it was inside torch.distributed).

    Only the frames below that first non-torch frame count: the launcher's own frames further out
    are torch.distributed code too."""
    waiting = False
    while frame is not None:
        path = frame.f_code.co_filename
        if f"{os.sep}torch{os.sep}" not in path and f"{os.sep}threading.py" not in path:
            return f"{os.path.basename(path)}:{frame.f_lineno} in {frame.f_code.co_name}", waiting
        waiting = waiting or f"torch{os.sep}distributed" in path
        frame = frame.f_back
    return "an unknown place", waiting


def _one_line(e, spec: LaunchSpec) -> str:
    """The failure that explains the others: a rank that raised or hung, before ranks that waited."""
    failures = sorted(e.failures.items(), key=lambda kv: (_is_waiting(kv[1]), kv[1].timestamp, kv[0]))
    rank, failure = failures[0]
    others = sorted(r for r in range(spec.world_size) if r != rank)
    stopped = f"; rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))} stopped" if others else ""
    return f"rank {rank} failed: {_cause(failure)}{stopped}"


def _is_waiting(failure) -> bool:
    return _message(failure).startswith(_WAITING, len("DistributedError: "))


def _message(failure) -> str:
    msg = failure.message
    if isinstance(msg, dict):
        msg = msg.get("message", "")
    return str(msg or "")


def _cause(failure) -> str:
    msg = _message(failure)
    if msg.startswith("DistributedError: "):
        return _first_line(msg[len("DistributedError: ") :])
    if msg and "To enable traceback" not in msg:  # the agent's placeholder when a rank left no error
        return _first_line(msg)
    code = failure.exitcode
    if code is not None and code < 0:
        return f"killed by {failure.signal_name()}"
    return f"exited with code {code} without raising an error"


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0][:300] if lines else "no message"


def _in_the_forkserver() -> bool:
    """Whether this module is being imported by the forkserver (_preload_forkserver's preload)."""
    frame: FrameType | None = sys._getframe()
    while frame is not None:
        code = frame.f_code
        if code.co_name == "main" and code.co_filename.endswith(os.path.join("multiprocessing", "forkserver.py")):
            return True
        frame = frame.f_back
    return False


def _quiet_unstarted_ranks() -> None:
    """In the forkserver: a rank whose start fails because the process launching it went away
    meanwhile (a Ctrl-C just at the fork: the named semaphore it was handed is already unlinked,
    or its pipe closed) ends without the forkserver's traceback; the launcher printed its one line.
    The forkserver's children call this hook only for a failure before the rank's own code."""
    default = sys.excepthook

    def hook(kind, value, tb):
        if not issubclass(kind, (OSError, EOFError)):
            default(kind, value, tb)

    sys.excepthook = hook


if _in_the_forkserver():
    _quiet_unstarted_ranks()
