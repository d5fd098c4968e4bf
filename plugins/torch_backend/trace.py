"""The torch backend's op hook: every aten op as a backend-neutral OpEvent.

This is the plain protocol-level hook (op, device, shapes, dtypes). The full placement analysis
(module paths, source lines, transfer and sync classification) is engine.trace's Tracer.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from opscope.engine import OpEvent, now_ns


def _tensors(values) -> list:
    import torch

    out = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out.extend(t for t in v if isinstance(t, torch.Tensor))
    return out


def _describe(tensors) -> tuple[tuple, tuple]:
    return (tuple(tuple(t.shape) for t in tensors), tuple(str(t.dtype).removeprefix("torch.") for t in tensors))


def _mode(sink: Callable[[OpEvent], None]):
    from torch.utils._python_dispatch import TorchDispatchMode

    class _OpSink(TorchDispatchMode):
        seq = itertools.count()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            ins = _tensors(list(args) + list(kwargs.values()))
            outs = _tensors(out if isinstance(out, (list, tuple)) else [out])
            device = str((outs or ins)[0].device) if (outs or ins) else "cpu"
            in_shapes, in_dtypes = _describe(ins)
            out_shapes, out_dtypes = _describe(outs)
            sink(
                OpEvent(
                    next(self.seq),
                    str(func.overloadpacket.__name__),
                    device,
                    in_shapes,
                    in_dtypes,
                    out_shapes,
                    out_dtypes,
                    now_ns(),
                    {"overload": str(func)},
                )
            )
            return out

    return _OpSink()


@contextmanager
def trace_ops(sink: Callable[[OpEvent], None]) -> Iterator[None]:
    """Report every aten op run in this thread while the context is open to ``sink``."""
    with _mode(sink):
        yield
