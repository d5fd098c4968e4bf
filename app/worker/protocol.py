"""The message protocol between the GUI and the engine worker process.

Qt-free on purpose: the worker imports it, and so could an engine on another machine. One message
per line, UTF-8 JSON. Requests go GUI → worker, each with an integer ``id``; everything the worker
says back carries the ``id`` of the request it belongs to (``None`` for unsolicited messages such as
``ready``). A request ends with exactly one terminal reply: ``result`` or ``error``.

Requests (``type``): load, generate, chat, stop, trace, diagnose, bench, roofline, shutdown, ping, info, debug.
Replies (``type``):
    ready     the worker is up: pid, python, protocol version
    started   the worker began a request (queued requests are not yet running)
    event     one engine.events event as a dict (``event["kind"]`` is the class name)
    marker    one engine.markers marker (phase, edge, t_ns, attrs) on the shared monotonic clock
    progress  done, total, eta_s, label, and optional ``point`` (a finished benchmark metric)
    batch     a chunk of trace op rows (columns of equal length)
    memory    the loaded model's memory stats plus the worker's RSS
    result    terminal: the request's payload
    error     terminal: error_type (an engine.errors class name), message, traceback (str or None);
              a failed load adds ``model``: the info of the model still loaded, or None when none is
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from opscope.engine import finite

PROTOCOL_VERSION = 1

TERMINAL = frozenset({"result", "error"})


@dataclass(frozen=True)
class LoadRequest:
    model: str | None = None  # path; None = the embedded default model
    device: str = "cpu"
    dtype: str = "float32"
    backend: str = "torch"
    attention: str = "sdpa"
    threads: int | None = None
    fastpath: str = "auto"  # engine.api.load's fastpath: auto | off | a settings string
    compile: str = "off"
    quantize: str = "off"
    type: str = "load"


@dataclass(frozen=True)
class GenerateRequest:
    prompt: str
    config: dict = field(default_factory=dict)  # engine.generate.GenerationConfig fields
    type: str = "generate"


@dataclass(frozen=True)
class ChatRequest:
    messages: list = field(default_factory=list)  # [{"role": ..., "content": ...}]
    config: dict = field(default_factory=dict)
    context_length: int = 0  # keep the newest turns that fit, with the reply, in this many tokens; 0 = the model's
    type: str = "chat"


@dataclass(frozen=True)
class StopRequest:
    target: int | None = None  # request id to cancel; None = whatever runs now
    type: str = "stop"


@dataclass(frozen=True)
class TraceRequest:
    prompt: str
    tokens: int = 8
    variant: str = "clean"  # engine.trace.variants: clean | leaky-norm | per-element-copy
    simulate: str = ""  # "" = trace on the loaded device; "meta" = a simulated accelerator
    max_events: int = 200_000
    db_url: str | None = None  # the run store the trace is saved to as a run (None: the default store)
    save: bool = True
    type: str = "trace"


@dataclass(frozen=True)
class DiagnoseRequest:
    """A bounded diagnosis of the loaded model (engine.diagnose): the result carries its lines."""

    prompt_tokens: int = 32
    tokens: int = 16
    trace_tokens: int = 3
    variant: str = "clean"
    simulate: str = ""  # "" = the loaded device; "meta" = a simulated accelerator
    save: bool = True  # as a run of kind "diagnosis" in db_url's store
    db_url: str | None = None
    type: str = "diagnose"


@dataclass(frozen=True)
class BenchRequest:
    suite: str
    params: dict = field(default_factory=dict)
    name: str = ""
    tags: list = field(default_factory=list)
    db_url: str | None = None
    quick: bool = False
    ab: str | None = None  # A/B: side B's flags as `opscope bench --ab` takes them ("" for A/A)
    type: str = "bench"


@dataclass(frozen=True)
class RooflineRequest:
    """A stored run's roofline (engine.bench.roofline.from_run, as its ``as_dict``). The worker reads
    the run and computes it: the GUI process never loads the run nor imports torch for it (an import
    of torch, even in a GUI-side thread, holds the GIL long enough to freeze the window)."""

    run_id: int
    db_url: str | None = None
    type: str = "roofline"


@dataclass(frozen=True)
class ShutdownRequest:
    type: str = "shutdown"


@dataclass(frozen=True)
class PingRequest:
    type: str = "ping"


@dataclass(frozen=True)
class InfoRequest:
    """What this engine offers: backends with their devices (available or not, with the reason),
    dtypes, benchmark suites and trace variants. The GUI fills its pickers from the answer."""

    type: str = "info"


@dataclass(frozen=True)
class DebugRequest:
    """Fault injection for tests and for checking a deployment: crash (SIGSEGV-like abort),
    exit (clean non-zero exit), hang (stop answering), oom (MemoryError inside a job)."""

    action: str = "hang"
    type: str = "debug"


Request = (
    LoadRequest
    | GenerateRequest
    | ChatRequest
    | StopRequest
    | TraceRequest
    | BenchRequest
    | RooflineRequest
    | ShutdownRequest
    | PingRequest
    | InfoRequest
    | DebugRequest
    | DiagnoseRequest
)

REQUEST_TYPES: dict[str, type] = {
    cls.type: cls  # type: ignore[attr-defined]
    for cls in (
        LoadRequest,
        GenerateRequest,
        ChatRequest,
        StopRequest,
        TraceRequest,
        BenchRequest,
        RooflineRequest,
        ShutdownRequest,
        PingRequest,
        InfoRequest,
        DebugRequest,
        DiagnoseRequest,
    )
}


class ProtocolError(ValueError):
    """A line that is not a valid message of this protocol."""


def encode(message: dict) -> bytes:
    """One message → one line. NaN/inf become null so any JSON reader accepts the line."""
    # default=str: a marker attribute or setting that is not JSON (a Path, a dtype) still travels.
    return (json.dumps(finite(message), separators=(",", ":"), default=str) + "\n").encode("utf-8")


def decode(line: bytes | str) -> dict:
    try:
        message = json.loads(line)
    except (ValueError, UnicodeDecodeError) as e:
        raise ProtocolError(f"not a JSON message: {line[:120]!r}") from e
    if not isinstance(message, dict) or "type" not in message:
        raise ProtocolError(f"message without a type: {line[:120]!r}")
    return message


def request_message(req_id: int, request: Request) -> dict:
    return {"id": req_id, **dataclasses.asdict(request)}


def parse_request(message: dict) -> tuple[int, Request]:
    """A decoded message → (id, typed request); unknown types and fields raise ProtocolError."""
    cls = REQUEST_TYPES.get(message.get("type", ""))
    if cls is None:
        raise ProtocolError(f"unknown request type {message.get('type')!r}; known: {sorted(REQUEST_TYPES)}")
    fields = {k: v for k, v in message.items() if k != "id"}
    try:
        return int(message.get("id", 0)), cls(**fields)
    except TypeError as e:
        raise ProtocolError(f"bad {cls.type} request: {e}") from e


def reply(req_id: int | None, kind: str, **fields: Any) -> dict:
    return {"id": req_id, "type": kind, **fields}


def event_to_dict(event: Any) -> dict:
    """An engine.events dataclass → a plain dict with ``kind``; nested stats become dicts too."""
    out: dict[str, Any] = {"kind": type(event).__name__}
    for f in dataclasses.fields(event):
        value = getattr(event, f.name)
        if dataclasses.is_dataclass(value):
            value = _stats_dict(value)
        out[f.name] = value
    return out


def _stats_dict(stats: Any) -> dict:
    data = stats.as_dict() if hasattr(stats, "as_dict") else dataclasses.asdict(stats)
    itl = getattr(stats, "itl_ms", None)
    if itl is not None:
        data["itl_ms"] = list(itl)
    return data
