"""The GUI side of the engine worker: a QProcess speaking app.protocol, never blocking the GUI.

Every request becomes a ``Job`` whose signals deliver the worker's streamed messages on the GUI
thread. A watchdog kills the worker when the running job goes silent for longer than its idle
timeout or when the worker stops answering pings; a crash, a kill or an exit fails the pending jobs
with a message that says what happened, and the next request starts a fresh worker (reloading the
last model first).
"""

from __future__ import annotations

import collections
import logging
import os
import sys
import time
from pathlib import Path

from opscope.app.ui import qt_compat  # noqa: F401  (must run before any emit)
from opscope.app.worker import protocol
from opscope.app.worker.protocol import LoadRequest, PingRequest, Request, ShutdownRequest, StopRequest
from PySide6.QtCore import QObject, QProcess, QProcessEnvironment, QTimer, Signal

log = logging.getLogger(__name__)

# Seconds a running job may go without any message before the worker counts as hung. A job that
# streams (tokens, progress, trace batches) resets the clock with every message.
IDLE_TIMEOUT_S = {
    "load": 300.0,
    "generate": 120.0,
    "chat": 120.0,
    "trace": 600.0,
    "diagnose": 600.0,
    "bench": 900.0,
    "debug": 30.0,
}
DEFAULT_IDLE_TIMEOUT_S = 120.0


class Job(QObject):
    """One request in flight. Exactly one of ``finished``/``failed`` fires, once."""

    started = Signal()
    event = Signal(dict)  # an engine.events event as a dict ("kind" = class name)
    progress = Signal(dict)
    batch = Signal(dict)
    finished = Signal(dict)  # the result payload
    failed = Signal(str, str)  # error_type, message

    def __init__(self, req_id: int, request: Request, idle_timeout_s: float) -> None:
        super().__init__()
        self.id = req_id
        self.request = request
        self.idle_timeout_s = idle_timeout_s
        self.running = False
        self.last_activity = time.monotonic()
        self.result: dict | None = None
        self.error: tuple[str, str] | None = None
        self.traceback: str | None = None
        self.reply: dict = {}  # the terminal error message as the worker sent it (extra fields included)

    @property
    def kind(self) -> str:
        return self.request.type

    @property
    def done(self) -> bool:
        return self.result is not None or self.error is not None

    def _finish(self, payload: dict) -> None:
        if not self.done:
            self.result = payload
            self.finished.emit(payload)

    def _fail(self, error_type: str, message: str, tb: str | None = None, reply: dict | None = None) -> None:
        if not self.done:
            self.error, self.traceback, self.reply = (error_type, message), tb, reply or {}
            self.failed.emit(error_type, message)


def worker_command() -> tuple[str, list[str]]:
    """How to start the worker: ``python -m opscope.app.worker.main``, or the frozen app with a flag."""
    if getattr(sys, "frozen", False):
        return sys.executable, ["--engine-worker"]
    return sys.executable, ["-m", "opscope.app.worker.main"]


class EngineClient(QObject):
    stateChanged = Signal(str)  # "stopped" | "starting" | "idle" | "busy" | "crashed"
    marker = Signal(dict)  # phase markers from the engine, on the shared monotonic clock
    memory = Signal(dict)
    modelLoaded = Signal(dict)  # model info after any successful load (also automatic reloads)
    modelChanged = Signal(object)  # model info of what the worker holds now, None = nothing loaded
    jobFailed = Signal(object)  # every Job that ends in an error (the window's one error funnel)
    jobsChanged = Signal()  # a job was queued, started or ended (who waits on whom changed)
    crashed = Signal(str)  # a user-facing message: what happened, what was lost, what happens next
    workerStarted = Signal(int)  # pid

    def __init__(
        self, parent: QObject | None = None, *, ping_interval_ms: int = 2000, liveness_timeout_s: float = 30.0
    ) -> None:
        super().__init__(parent)
        self._proc: QProcess | None = None
        self._buffer = bytearray()
        self._stderr_tail: collections.deque[str] = collections.deque(maxlen=20)
        self._jobs: dict[int, Job] = {}
        self._outbox: list[dict] = []
        self._next_id = 1
        self._ready = False
        self._expected_exit = False
        self._kill_reason: str | None = None
        self._ping_sent_at: float | None = None
        self.liveness_timeout_s = liveness_timeout_s
        self.pid: int | None = None
        self.model_spec: LoadRequest | None = None  # what is loaded (reloaded after a restart)
        self.model_info: dict | None = None
        self.state = "stopped"
        self._watchdog = QTimer(self, interval=250, timeout=self._check_watchdog)
        self._pinger = QTimer(self, interval=ping_interval_ms, timeout=self._ping)

    # -- requests -------------------------------------------------------------------------------
    def submit(self, request: Request, *, idle_timeout_s: float | None = None) -> Job:
        """Send ``request`` (starting the worker if needed); returns its Job at once."""
        if idle_timeout_s is None:
            idle_timeout_s = IDLE_TIMEOUT_S.get(request.type, DEFAULT_IDLE_TIMEOUT_S)
        job = Job(self._take_id(), request, idle_timeout_s)
        self._track(job)
        if not self._running():
            self._start(reload=not isinstance(request, LoadRequest))
        self._send(protocol.request_message(job.id, request))
        self._set_state("busy" if self._ready else self.state)
        self.jobsChanged.emit()
        return job

    def _track(self, job: Job) -> None:
        self._jobs[job.id] = job
        if isinstance(job.request, LoadRequest):
            job.finished.connect(lambda info, j=job: self._on_loaded(j.request, info))
            job.failed.connect(lambda *_a, j=job: self._on_load_failed(j))

    def ahead_of(self, job: Job) -> Job | None:
        """The job ``job`` waits for: the one running now, or the oldest queued before it."""
        if job.running or job.done:
            return None
        waiting = [j for j in self._jobs.values() if j.id < job.id]
        return next((j for j in waiting if j.running), waiting[0] if waiting else None)

    def stop(self, job: Job | None = None) -> None:
        """Cancel ``job`` (or whatever runs now); its stream ends with stop_reason "cancelled"."""
        if self._running():
            self._send(protocol.request_message(self._take_id(), StopRequest(job.id if job else None)))

    def kill(self, reason: str = "killed by the user") -> None:
        """Kill the worker now (a stuck kernel cannot be cancelled politely)."""
        if self._running():
            self._kill_reason = reason
            self._proc.kill()

    def shutdown(self, timeout_ms: int = 3000) -> None:
        """Ask the worker to exit, wait a little, then kill it. Called when the window closes."""
        proc = self._proc
        if proc is None or proc.state() == QProcess.NotRunning:
            return
        self._expected_exit = True
        self._send(protocol.request_message(self._take_id(), ShutdownRequest()))
        proc.closeWriteChannel()
        if not proc.waitForFinished(timeout_ms):
            proc.kill()
            proc.waitForFinished(1000)

    @property
    def busy(self) -> bool:
        return bool(self._jobs)

    def worker_output(self) -> str:
        """The worker's last lines on stderr (its log and any crash report), for "Details"."""
        return "\n".join(self._stderr_tail)

    # -- process management ---------------------------------------------------------------------
    def _start(self, reload: bool) -> None:
        self._buffer.clear()
        self._stderr_tail.clear()
        self._ready, self._expected_exit, self._kill_reason = False, False, None
        self._ping_sent_at = None
        proc = QProcess(self)
        program, args = worker_command()
        proc.setProcessEnvironment(_worker_environment())
        proc.readyReadStandardOutput.connect(self._read_stdout)
        proc.readyReadStandardError.connect(self._read_stderr)
        proc.finished.connect(self._on_exit)
        proc.errorOccurred.connect(self._on_process_error)
        self._proc = proc
        self._set_state("starting")
        proc.start(program, args)
        self._watchdog.start()
        self._pinger.start()
        if reload and self.model_spec is not None:
            # The worker restarted: bring back the model the user had before the next request runs.
            job = Job(self._take_id(), self.model_spec, IDLE_TIMEOUT_S["load"])
            self._track(job)
            self._send(protocol.request_message(job.id, self.model_spec))

    def _running(self) -> bool:
        return self._proc is not None and self._proc.state() != QProcess.NotRunning

    def _send(self, message: dict) -> None:
        if self._ready and self._proc is not None:
            self._proc.write(protocol.encode(message))
        else:
            self._outbox.append(message)

    def _take_id(self) -> int:
        self._next_id += 1
        return self._next_id - 1

    def _set_state(self, state: str) -> None:
        if state != self.state:
            self.state = state
            self.stateChanged.emit(state)

    # -- incoming -------------------------------------------------------------------------------
    def _read_stdout(self) -> None:
        self._buffer += bytes(self._proc.readAllStandardOutput().data())
        while (end := self._buffer.find(b"\n")) >= 0:
            line = bytes(self._buffer[:end])
            del self._buffer[: end + 1]
            try:
                self._dispatch(protocol.decode(line))
            except protocol.ProtocolError:
                log.warning("engine worker wrote a non-protocol line: %r", line[:200])

    def _read_stderr(self) -> None:
        text = bytes(self._proc.readAllStandardError().data()).decode("utf-8", "replace")
        for line in text.splitlines():
            if line.strip():
                self._stderr_tail.append(line)
                log.debug("worker: %s", line)

    def _dispatch(self, msg: dict) -> None:
        kind, job = msg["type"], self._jobs.get(msg.get("id"))
        if kind == "ready":
            self._on_ready(msg)
        elif kind == "marker":
            self.marker.emit(msg)
        elif kind == "memory":
            self.memory.emit(msg.get("stats", {}))
        elif job is not None:
            self._dispatch_job(job, kind, msg)
        elif msg.get("pong"):
            self._ping_sent_at = None
        elif kind == "error":
            log.warning("engine worker error without a request: %s", msg.get("message"))

    def _dispatch_job(self, job: Job, kind: str, msg: dict) -> None:
        job.last_activity = time.monotonic()
        if kind == "started":
            job.running = True
            job.started.emit()
            self.jobsChanged.emit()
        elif kind == "event":
            job.event.emit(msg["event"])
        elif kind == "progress":
            job.progress.emit(msg)
        elif kind == "batch":
            job.batch.emit(msg)
        elif kind in protocol.TERMINAL:
            del self._jobs[job.id]
            if kind == "result":
                job._finish({k: v for k, v in msg.items() if k not in ("id", "type")})
            else:
                job._fail(msg.get("error_type", "EngineError"), msg.get("message", ""), msg.get("traceback"), msg)
                self.jobFailed.emit(job)
            if not self._jobs:
                self._set_state("idle")
            self.jobsChanged.emit()

    def _on_ready(self, msg: dict) -> None:
        self._ready = True
        self.pid = msg.get("pid")
        self.workerStarted.emit(self.pid or 0)
        outbox, self._outbox = self._outbox, []
        for message in outbox:
            self._send(message)
        self._set_state("busy" if self._jobs else "idle")

    def _on_loaded(self, spec: LoadRequest, info: dict) -> None:
        self.model_spec, self.model_info = spec, info
        self.modelLoaded.emit(info)
        self.modelChanged.emit(info)

    def _on_load_failed(self, job: Job) -> None:
        """A failed load: the worker says what it holds now (the previous model, or nothing)."""
        if "model" not in job.reply:
            return  # the worker died: the last good model comes back with the next request
        info = job.reply["model"]
        if info is None:
            self.model_spec = None
        self.model_info = info
        self.modelChanged.emit(info)

    # -- failure handling -----------------------------------------------------------------------
    def _on_exit(self, exit_code: int, exit_status: QProcess.ExitStatus) -> None:
        self._watchdog.stop()
        self._pinger.stop()
        self._ready = False
        self._outbox.clear()
        if self._expected_exit:  # shut down on purpose (the window closes): what still ran is cancelled
            jobs, self._jobs = list(self._jobs.values()), {}
            for job in jobs:
                job._fail("Cancelled", "the engine was shut down while it ran (the window closed)")
                self.jobFailed.emit(job)
            self._set_state("stopped")
            return
        message = self._exit_message(exit_code, exit_status)
        self._fail_all(message)

    def _exit_message(self, exit_code: int, exit_status: QProcess.ExitStatus) -> str:
        running = next((j.kind for j in self._jobs.values() if j.running), None)
        during = f" while running {running}" if running else ""
        if self._kill_reason:
            what = f"was stopped{during}: {self._kill_reason}"
        elif exit_status == QProcess.CrashExit:
            what = f"crashed{during}"
        else:
            what = f"exited with code {exit_code}{during}"
        tail = " | ".join(list(self._stderr_tail)[-3:])
        detail = f" Last output: {tail}" if tail else ""
        return f"The engine process {what}. The window is fine; the engine restarts on the next request.{detail}"

    def _on_process_error(self, error: QProcess.ProcessError) -> None:
        if error == QProcess.FailedToStart:
            program, args = worker_command()
            message = f"could not start the engine worker ({program} {' '.join(args)}): {self._proc.errorString()}"
            self._outbox.clear()
            self._watchdog.stop()
            self._pinger.stop()
            self._fail_all(message)

    def _fail_all(self, message: str) -> None:
        """The worker is gone: every pending job fails with ``message``; ``crashed`` says it once."""
        jobs, self._jobs = list(self._jobs.values()), {}
        for job in jobs:
            job._fail("EngineCrashed", message, "\n".join(self._stderr_tail))
            self.jobFailed.emit(job)
        self._set_state("crashed")
        self.jobsChanged.emit()
        self.crashed.emit(message)

    def _check_watchdog(self) -> None:
        now = time.monotonic()
        for job in self._jobs.values():
            if job.running and now - job.last_activity > job.idle_timeout_s:
                self.kill(f"no sign of life for {job.idle_timeout_s:.0f} s during {job.kind} (hung?)")
                return
        if self._ping_sent_at is not None and now - self._ping_sent_at > self.liveness_timeout_s:
            self.kill(f"it did not answer for {self.liveness_timeout_s:.0f} s")

    def _ping(self) -> None:
        if self._ready and self._ping_sent_at is None:
            self._ping_sent_at = time.monotonic()
            self._send(protocol.request_message(self._take_id(), PingRequest()))


def _worker_environment() -> QProcessEnvironment:
    env = QProcessEnvironment.systemEnvironment()
    # From a checkout the worker must find the same `app` and `engine` packages as the GUI.
    root = str(Path(__file__).resolve().parent.parent)
    current = env.value("PYTHONPATH", "")
    env.insert("PYTHONPATH", root + (os.pathsep + current if current else ""))
    env.insert("PYTHONUNBUFFERED", "1")
    return env
