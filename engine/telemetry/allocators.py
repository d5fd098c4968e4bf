"""Framework allocators of *this* process: PyTorch's CUDA caching allocator and MLX's allocator.

Both are per-process, so they only mean something in the process that runs the model (the engine
worker). They never import their framework: importing torch costs seconds and would only report
an empty allocator; the source is available once the framework is already imported here.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from typing import Any

from opscope.engine.telemetry.base import LogOnce, Source, to_float

log = logging.getLogger(__name__)
_once = LogOnce(log)


class TorchCudaSource(Source):
    """``torch.cuda<N>.allocated_bytes``, ``reserved_bytes``, ``peak_bytes`` per visible device."""

    name = "torch"

    def __init__(self) -> None:
        super().__init__()
        self._cuda: Any = None
        self._n = 0

    def _open(self) -> None:
        torch = sys.modules.get("torch")
        if torch is None:
            self._unavailable(
                "torch is not imported in this process (its allocator is per-process)", missing_package=True
            )
            return
        if not torch.cuda.is_available():
            self._unavailable("torch sees no CUDA device")
            return
        self._cuda, self._n = torch.cuda, torch.cuda.device_count()
        self._ready(
            {
                f"torch.cuda{i}.{k}": "bytes"
                for i in range(self._n)
                for k in ("allocated_bytes", "reserved_bytes", "peak_bytes")
            }
        )

    def _sample(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for i in range(self._n):
            # These read counters only; on a device not yet initialized they return 0, they do
            # not create a CUDA context.
            out[f"torch.cuda{i}.allocated_bytes"] = _read(self._cuda.memory_allocated, i)
            out[f"torch.cuda{i}.reserved_bytes"] = _read(self._cuda.memory_reserved, i)
            out[f"torch.cuda{i}.peak_bytes"] = _read(self._cuda.max_memory_allocated, i)
        return out


class MlxSource(Source):
    """``mlx.active_bytes``, ``mlx.peak_bytes``, ``mlx.cache_bytes`` of MLX's allocator."""

    name = "mlx"

    def __init__(self) -> None:
        super().__init__()
        self._readers: dict[str, Callable[[], int]] = {}

    def _open(self) -> None:
        mx = sys.modules.get("mlx.core")
        if mx is None:
            self._unavailable(
                "mlx is not imported in this process (its allocator is per-process)", missing_package=True
            )
            return
        for key in ("active", "peak", "cache"):
            # mlx >= 0.24 has mx.get_*_memory; older releases only mx.metal.get_*_memory.
            fn = getattr(mx, f"get_{key}_memory", None)
            if fn is None:
                fn = getattr(getattr(mx, "metal", None), f"get_{key}_memory", None)
            if fn is not None:
                self._readers[f"mlx.{key}_bytes"] = fn
        if not self._readers:
            self._unavailable("this mlx has no memory counters (upgrade mlx)")
            return
        self._ready({name: "bytes" for name in self._readers})

    def _sample(self) -> dict[str, float]:
        return {name: _read(fn) for name, fn in self._readers.items()}


def _read(fn: Callable[..., Any], *args: Any) -> float:
    try:
        return to_float(fn(*args))
    except Exception as e:  # a counter that fails reads NaN; telemetry never raises
        _once(
            (getattr(fn, "__name__", repr(fn)), type(e).__name__),
            logging.WARNING,
            "allocator telemetry: %s failed: %s",
            getattr(fn, "__name__", fn),
            e,
        )
        return float("nan")
