"""Benchmark primitives on MLX: every sample ends with ``mx.eval``, which waits for the work,
so the clock reads bracket computation, not lazy graph building."""

from __future__ import annotations

import mlx.core as mx
from opscope.engine import ConfigError, now_ns
from opscope.plugins.mlx_backend.loaded import resolve_device
from opscope.plugins.mlx_backend.weights import mlx_dtype


def _timed(make, device: str, iterations: int) -> list[int]:
    if iterations < 1:
        raise ConfigError(f"iterations must be at least 1, got {iterations}")
    with mx.stream(resolve_device(device)):
        mx.eval(make())  # warm-up, not counted
        out = []
        for _ in range(iterations):
            t0 = now_ns()
            mx.eval(make())
            out.append(now_ns() - t0)
    return out


def bench_matmul(m: int, n: int, k: int, *, device: str, dtype: str, iterations: int) -> list[int]:
    """ns per (m×k)@(k×n) product; FLOPs per product = 2·m·n·k."""
    dt = mlx_dtype(dtype)
    with mx.stream(resolve_device(device)):
        a, b = mx.random.normal((m, k)).astype(dt), mx.random.normal((k, n)).astype(dt)
        mx.eval(a, b)
    return _timed(lambda: mx.matmul(a, b), device, iterations)


def bench_copy(n_bytes: int, *, device: str, iterations: int) -> list[int]:
    """ns per copy of ``n_bytes`` (2·n_bytes moved: read + write). ``src + 0`` forces a real
    copy; mx.array(src) could share the buffer."""
    with mx.stream(resolve_device(device)):
        src = mx.ones((n_bytes,), dtype=mx.uint8)
        mx.eval(src)
    return _timed(lambda: src + 0, device, iterations)
