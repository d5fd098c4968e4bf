"""The engine worker process: ``python -m opscope.app.worker.main`` (or ``opscope-gui --engine-worker`` frozen).

Speaks app.protocol on stdin/stdout and never imports Qt. A reader thread takes requests off stdin
so that ``stop`` and ``ping`` are answered while a job runs; jobs run one at a time on the main
thread. When stdin closes (the GUI went away) the worker exits, so no orphan keeps a GPU busy.
"""

from __future__ import annotations

import logging
import os
import queue
import sys
import threading
import traceback
from typing import BinaryIO

from opscope.app.worker import protocol
from opscope.app.worker.protocol import DebugRequest, PingRequest, ShutdownRequest, StopRequest

log = logging.getLogger(__name__)


class Channel:
    """The protocol's output side: one lock, one line per message, flushed at once."""

    def __init__(self, out: BinaryIO) -> None:
        self._out = out
        self._lock = threading.Lock()

    @classmethod
    def from_stdio(cls) -> Channel:
        # Keep the real stdout for the protocol and point fd 1 at stderr: a library that prints
        # (or a C extension writing to fd 1) must not corrupt the message stream.
        proto_fd = os.dup(1)
        os.dup2(2, 1)
        sys.stdout = sys.stderr
        return cls(os.fdopen(proto_fd, "wb", buffering=0))

    def send(self, message: dict) -> None:
        line = protocol.encode(message)
        with self._lock:
            try:
                self._out.write(line)
            except (BrokenPipeError, OSError):
                os._exit(0)  # the GUI is gone; nobody is left to tell


class Worker:
    """Runs requests in order; owns the cancel flag of the running one."""

    def __init__(self, channel: Channel) -> None:
        from opscope.app.worker.jobs import EngineState

        self.channel = channel
        self.state = EngineState(send=self._send_current)
        self.jobs: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._current: int | None = None
        self._cancel = threading.Event()
        self._cancelled_ids: set[int] = set()

    def _send_current(self, kind: str, **fields) -> None:
        self.channel.send(protocol.reply(self._current, kind, **fields))

    def on_line(self, line: bytes) -> bool:
        """Reader thread: handle one request line; False when the worker should stop reading."""
        try:
            req_id, req = protocol.parse_request(protocol.decode(line))
        except protocol.ProtocolError as e:
            self.channel.send(protocol.reply(None, "error", error_type="ProtocolError", message=str(e), traceback=None))
            return True
        if isinstance(req, PingRequest):
            self.channel.send(protocol.reply(req_id, "result", pong=True, pid=os.getpid()))
        elif isinstance(req, StopRequest):
            self.cancel(req.target)
            self.channel.send(protocol.reply(req_id, "result", stopped=req.target))
        elif isinstance(req, ShutdownRequest):
            self.cancel(None)
            self.jobs.put(None)
            return False
        else:
            self.jobs.put((req_id, req))
        return True

    def cancel(self, target: int | None) -> None:
        with self._lock:
            if target is None or target == self._current:
                self._cancel.set()
            else:
                self._cancelled_ids.add(target)

    def run_forever(self) -> None:
        while (item := self.jobs.get()) is not None:
            self.run_one(*item)

    def run_one(self, req_id: int, req) -> None:
        with self._lock:
            self._current = req_id
            self._cancel = threading.Event()
            skipped = req_id in self._cancelled_ids
        cancel = self._cancel
        self._send_current("started", request=req.type)
        if skipped:
            self._send_current("error", error_type="Cancelled", message="cancelled before it started", traceback=None)
        else:
            self._execute(req, cancel)
        with self._lock:
            self._current = None

    def _execute(self, req, cancel: threading.Event) -> None:
        from opscope.engine import EngineError

        try:
            if isinstance(req, DebugRequest):
                payload = _debug(req)
            else:
                payload = self.state.handle(req, cancel)
            self._send_current("result", **payload)
        except EngineError as e:  # a user error: one line, the traceback only for the GUI's details
            self._fail(req, type(e).__name__, str(e))
        except MemoryError as e:
            self._fail(req, "OutOfMemory", f"out of memory while running {req.type}: {e}")
        except Exception as e:  # a bug, not a user error
            log.exception("%s request failed", req.type)
            self._fail(req, type(e).__name__, f"{req.type} failed: {e}")
        finally:
            self.state.report_memory()

    def _fail(self, req, error_type: str, message: str) -> None:
        """The terminal error reply, with the traceback; a failed load also says what is loaded now
        (``model``: the model info, or None when nothing is), so the GUI never has to guess."""
        extra = {"model": self.state.info} if req.type == "load" else {}
        self._send_current("error", error_type=error_type, message=message, traceback=traceback.format_exc(), **extra)


def _debug(req: DebugRequest) -> dict:
    if req.action == "exit":
        os._exit(3)
    if req.action == "crash":
        os.abort()  # SIGABRT: the closest portable stand-in for a segfault in a native kernel
    if req.action == "hang":
        threading.Event().wait()  # never sends another message: the GUI's watchdog must act
    if req.action == "oom":
        raise MemoryError("debug: simulated allocation failure")
    return {"action": req.action}


def _read_requests(worker: Worker, stdin: BinaryIO) -> None:
    for line in stdin:
        if line.strip() and not worker.on_line(line):
            return
    # stdin closed: the GUI is gone (or killed us on purpose); leave at once.
    os._exit(0)


def _leave_the_terminal_to_the_window() -> None:
    """Ctrl-C in a terminal goes to its whole foreground process group, this worker included, and
    `timeout`/`kill 0` signal the group: the window handles those (it closes and shuts this worker
    down), so the worker ignores Ctrl-C and leaves the group rather than crash mid-job."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(os, "setpgid"):
        try:
            os.setpgid(0, 0)
        except OSError:  # already a session leader: nothing shares its group
            pass


def main(argv: list[str] | None = None) -> int:
    _leave_the_terminal_to_the_window()
    channel = Channel.from_stdio()
    logging.basicConfig(
        stream=sys.stderr,
        level=os.environ.get("OPSCOPE_WORKER_LOG", "WARNING"),
        format="worker %(levelname)s %(name)s: %(message)s",
    )
    worker = Worker(channel)
    threading.Thread(
        target=_read_requests, args=(worker, sys.stdin.buffer), daemon=True, name="opscope-requests"
    ).start()
    channel.send(
        protocol.reply(
            None, "ready", pid=os.getpid(), python=sys.version.split()[0], protocol=protocol.PROTOCOL_VERSION
        )
    )
    worker.run_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
