"""Per-op tracing at the MLX function level.

While ``trace_ops(sink)`` is open, the functions of ``mlx.core`` and ``mlx.core.fast`` and the
arithmetic/indexing operators and sync methods of ``mx.array`` are replaced by wrappers that report
each call as an OpEvent (op, stream, input/output shapes and dtypes). mlx.nn layers call these
through the module (``mx.addmm``, ``mx.quantized_matmul``, ``x @ w``), so a model's forward pass is
seen whole. MLX is lazy: ``t_ns`` is when the op was put in the graph; ``eval``, ``item`` and
``tolist`` events mark where the host waits for results.

The patch is process-wide (module attributes), so ops issued by other threads during the trace are
reported too; nesting two traces is refused.
"""

from __future__ import annotations

import functools
import itertools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import mlx.core as mx
from opscope.engine import BackendError, OpEvent, now_ns

ARRAY_METHODS = (
    "__add__",
    "__radd__",
    "__sub__",
    "__rsub__",
    "__mul__",
    "__rmul__",
    "__truediv__",
    "__rtruediv__",
    "__matmul__",
    "__neg__",
    "__pow__",
    "__getitem__",
    "__setitem__",
    "__lt__",
    "__gt__",
    "reshape",
    "transpose",
    "astype",
    "item",
    "tolist",
)
# Functions that are not ops on arrays (devices, streams, memory, transforms, I/O).
SKIP = {
    "array",
    "stream",
    "default_device",
    "set_default_device",
    "default_stream",
    "set_default_stream",
    "new_stream",
    "new_thread_local_stream",
    "synchronize",
    "compile",
    "disable_compile",
    "enable_compile",
    "grad",
    "value_and_grad",
    "vjp",
    "jvp",
    "vmap",
    "checkpoint",
    "custom_function",
    "export_function",
    "import_function",
    "exporter",
    "export_to_dot",
    "load",
    "save",
    "savez",
    "savez_compressed",
    "save_gguf",
    "save_safetensors",
    "is_available",
    "device_count",
    "device_info",
    "set_wired_limit",
    "clear_cache",
    "async_eval",
    "issubdtype",
    "finfo",
    "iinfo",
    "Device",
    "Stream",
    "Dtype",
}
_active = threading.Lock()


def _describe(values) -> tuple[tuple[tuple[int, ...], ...], tuple[str, ...]]:
    arrays = [v for v in _flatten(values) if isinstance(v, mx.array)]
    return tuple(tuple(a.shape) for a in arrays), tuple(str(a.dtype).removeprefix("mlx.core.") for a in arrays)


def _flatten(values) -> Iterator:
    for v in values:
        if isinstance(v, (list, tuple)):
            yield from v
        else:
            yield v


def _wrap(name: str, fn: Callable, sink: Callable[[OpEvent], None], seq: Iterator[int]) -> Callable:
    @functools.wraps(fn)
    def traced(*args, **kwargs):
        out = fn(*args, **kwargs)
        stream = kwargs.get("stream") or mx.default_stream(mx.default_device())
        in_shapes, in_dtypes = _describe(list(args) + list(kwargs.values()))
        out_shapes, out_dtypes = _describe([out])
        sink(OpEvent(next(seq), name, str(stream), in_shapes, in_dtypes, out_shapes, out_dtypes, now_ns()))
        return out

    return traced


def _targets() -> list[tuple[object, str, str]]:
    """(owner, attribute, op name) for everything patched."""
    out = [
        (mx, n, n)
        for n in dir(mx)
        if not n.startswith("_") and n not in SKIP and n[0].islower() and callable(getattr(mx, n))
    ]
    out += [(mx.fast, n, f"fast.{n}") for n in dir(mx.fast) if not n.startswith("_") and callable(getattr(mx.fast, n))]
    out += [(mx.array, n, f"array.{n.strip('_')}") for n in ARRAY_METHODS]
    return [(o, a, name) for o, a, name in out if not isinstance(getattr(o, a, None), (type, type(None)))]


@contextmanager
def trace_ops(sink: Callable[[OpEvent], None]) -> Iterator[None]:
    """Report every MLX op issued while the context is open to ``sink``."""
    if not _active.acquire(blocking=False):
        raise BackendError("an mlx op trace is already running; nested traces are not supported")
    seq = itertools.count()
    targets = _targets()
    saved = [(owner, attr, getattr(owner, attr)) for owner, attr, _ in targets]
    try:
        for (owner, attr, name), (_, _, fn) in zip(targets, saved):
            setattr(owner, attr, _wrap(name, fn, sink, seq))
        yield
    finally:
        for owner, attr, fn in saved:
            setattr(owner, attr, fn)
        _active.release()
