"""The GUI↔worker protocol and the worker, without Qt: encoding, typed requests, the worker's
request handling in-process, and the worker's process hygiene (no Qt, stdout kept for messages)."""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys

import pytest
from opscope.app.worker import protocol
from opscope.app.worker.protocol import (
    ChatRequest,
    DebugRequest,
    GenerateRequest,
    PingRequest,
    ShutdownRequest,
    StopRequest,
)
from opscope.engine.generation.events import Finished, Token, stats_from_times

ROOT = str(__import__("pathlib").Path(__file__).resolve().parents[2])


def test_request_round_trip_keeps_type_and_fields():
    req = ChatRequest(messages=[{"role": "user", "content": "hé"}], config={"max_tokens": 4})
    line = protocol.encode(protocol.request_message(7, req))
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    req_id, back = protocol.parse_request(protocol.decode(line))
    assert (req_id, back) == (7, req)


def test_every_request_type_is_registered():
    assert set(protocol.REQUEST_TYPES) == {
        "load",
        "generate",
        "chat",
        "stop",
        "trace",
        "diagnose",
        "bench",
        "roofline",
        "shutdown",
        "ping",
        "info",
        "debug",
    }


@pytest.mark.parametrize(
    "message, needle",
    [
        ({"id": 1, "type": "explode"}, "unknown request type"),
        ({"id": 1, "type": "load", "colour": "red"}, "bad load request"),
        ({"id": 1, "type": "generate"}, "bad generate request"),  # prompt is required
    ],
)
def test_bad_requests_raise_protocol_error(message, needle):
    with pytest.raises(protocol.ProtocolError, match=needle):
        protocol.parse_request(message)


@pytest.mark.parametrize("line", [b"not json", b"[1, 2]", b'{"id": 3}'])
def test_decode_rejects_non_messages(line):
    with pytest.raises(protocol.ProtocolError):
        protocol.decode(line)


def test_nan_and_inf_become_null_so_any_json_reader_accepts_them():
    line = protocol.encode({"type": "x", "a": math.nan, "b": [math.inf, 1.5], "c": {"d": -math.inf}})
    assert json.loads(line) == {"type": "x", "a": None, "b": [None, 1.5], "c": {"d": None}}


def test_events_become_dicts_with_kind_and_nested_stats():
    stats = stats_from_times(0, 1_000_000, 5_000_000, 3, [6_000_000, 8_000_000, 11_000_000], 12_000_000)
    data = protocol.event_to_dict(Finished("eos", stats, 12_000_000, "hi"))
    assert data["kind"] == "Finished" and data["stop_reason"] == "eos" and data["text"] == "hi"
    assert data["stats"]["ttft_ms"] == pytest.approx(6.0)
    assert data["stats"]["itl_ms"] == pytest.approx([2.0, 3.0])
    assert protocol.event_to_dict(Token(0, 42, "a", 5))["kind"] == "Token"
    json.loads(protocol.encode({"type": "event", "event": data}))  # travels as JSON


class _Sink(io.RawIOBase):
    def __init__(self):
        self.lines: list[dict] = []

    def writable(self):
        return True

    def write(self, b):
        self.lines.append(json.loads(bytes(b)))
        return len(b)


@pytest.fixture
def worker():
    from opscope.app.worker.main import Channel, Worker

    sink = _Sink()
    return Worker(Channel(sink)), sink


def _line(req_id, req) -> bytes:
    return protocol.encode(protocol.request_message(req_id, req))


def test_worker_answers_ping_on_the_reader_thread(worker):
    w, sink = worker
    assert w.on_line(_line(1, PingRequest())) is True
    assert sink.lines[-1]["id"] == 1 and sink.lines[-1]["pong"] is True
    assert w.jobs.empty()  # a ping never waits behind a running job


def test_stop_of_a_queued_request_cancels_it_before_it_starts(worker):
    w, sink = worker
    w.on_line(_line(5, GenerateRequest("hello")))
    w.on_line(_line(6, StopRequest(target=5)))
    w.run_one(*w.jobs.get_nowait())
    kinds = [(m["id"], m["type"]) for m in sink.lines]
    assert (5, "started") in kinds
    error = next(m for m in sink.lines if m["type"] == "error")
    assert error["id"] == 5 and error["error_type"] == "Cancelled"


def test_stop_sets_the_running_jobs_cancel_flag(worker):
    w, _sink = worker
    w._current = 9
    w.cancel(9)
    assert w._cancel.is_set()


def test_job_errors_are_typed_and_end_the_request(worker):
    w, sink = worker
    w.run_one(3, DebugRequest("oom"))
    error = next(m for m in sink.lines if m["type"] == "error")
    assert error["id"] == 3 and error["error_type"] == "OutOfMemory" and "out of memory" in error["message"]
    assert sink.lines[-1]["type"] == "memory"  # memory is reported after every job, even a failed one


def test_generate_without_a_model_is_a_config_error_not_a_crash(worker):
    w, sink = worker
    w.run_one(4, GenerateRequest("hi"))
    error = next(m for m in sink.lines if m["type"] == "error")
    assert error["error_type"] == "ConfigError" and "no model is loaded" in error["message"]


def test_unknown_sampling_setting_is_rejected_with_the_known_ones():
    from opscope.app.worker.jobs import generation_config
    from opscope.engine.core.errors import ConfigError

    assert generation_config({"max_tokens": 3, "stop": ["\n"]}).stop == ("\n",)
    with pytest.raises(ConfigError, match="temprature"):
        generation_config({"temprature": 0.5})


def test_shutdown_stops_reading_and_cancels(worker):
    w, _sink = worker
    assert w.on_line(_line(2, ShutdownRequest())) is False
    assert w.jobs.get_nowait() is None


def test_worker_modules_never_import_qt():
    code = (
        "import sys, opscope.app.worker.main, opscope.app.worker.jobs, opscope.app.worker.protocol, opscope.app.telemetry.source; from opscope import app;"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('PySide6', 'pyqtgraph', 'shiboken6')];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)


def test_worker_process_keeps_stdout_for_messages_and_exits_when_stdin_closes():
    """A library printing to stdout inside the worker must not corrupt the message stream."""
    code = (
        "from opscope.app.worker.main import Channel; c = Channel.from_stdio(); print('library noise');"
        "import os; os.write(1, b'C noise\\n'); c.send({'id': None, 'type': 'ready'})"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, cwd=ROOT, timeout=60)
    assert [json.loads(line) for line in out.stdout.splitlines()] == [{"id": None, "type": "ready"}]
    assert b"library noise" in out.stderr and b"C noise" in out.stderr

    proc = subprocess.Popen(
        [sys.executable, "-m", "opscope.app.worker.main"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT
    )
    ready = json.loads(proc.stdout.readline())
    assert ready["type"] == "ready" and ready["pid"] == proc.pid
    proc.stdin.write(_line(1, PingRequest()))
    proc.stdin.flush()
    assert json.loads(proc.stdout.readline())["pong"] is True
    proc.stdin.close()  # the GUI went away
    assert proc.wait(timeout=30) == 0
