"""Benchmark primitives: timed matmul and device copy, the device synchronized before every clock
read so each sample is the work itself, not its launch."""

from __future__ import annotations

from collections.abc import Callable

from opscope.engine import ConfigError, now_ns


def _sync(device) -> Callable[[], None]:
    import torch

    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    if device.type == "mps":
        return torch.mps.synchronize
    return lambda: None  # CPU ops are synchronous


def _timed(step: Callable[[], None], sync: Callable[[], None], iterations: int) -> list[int]:
    if iterations < 1:
        raise ConfigError(f"iterations must be at least 1, got {iterations}")
    step()  # warm-up: allocator, kernel selection; not counted
    sync()
    out = []
    for _ in range(iterations):
        t0 = now_ns()
        step()
        sync()
        out.append(now_ns() - t0)
    return out


def bench_matmul(m: int, n: int, k: int, *, device: str, dtype: str, iterations: int) -> list[int]:
    """ns per (m×k)@(k×n) product; FLOPs per product = 2·m·n·k."""
    import torch
    from opscope.engine import resolve_device, resolve_dtype

    dev, dt = resolve_device(device), resolve_dtype(dtype)
    a, b = torch.randn(m, k, device=dev, dtype=dt), torch.randn(k, n, device=dev, dtype=dt)
    out = torch.empty(m, n, device=dev, dtype=dt)
    return _timed(lambda: torch.mm(a, b, out=out), _sync(dev), iterations)


def bench_copy(n_bytes: int, *, device: str, iterations: int) -> list[int]:
    """ns per device-to-device copy of ``n_bytes`` (2·n_bytes moved: read + write)."""
    import torch
    from opscope.engine import resolve_device

    dev = resolve_device(device)
    src = torch.ones(n_bytes, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    return _timed(lambda: dst.copy_(src), _sync(dev), iterations)
