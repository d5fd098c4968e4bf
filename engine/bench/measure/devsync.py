"""Device synchronization before clock reads.

Accelerators run asynchronously: reading the clock right after launching work measures the launch,
not the work. Every timed region is bracketed by the device's own synchronize. Frameworks are
imported only when their device is used.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opscope.engine.core.errors import DeviceError

Sync = Callable[[Any], None]


def _no_sync(out: Any) -> None:
    # CPU ops in torch are synchronous: the result exists when the call returns.
    return None


def _torch_sync(kind: str, index: int | None) -> Sync:
    import torch

    if kind == "cuda":  # ROCm builds of torch also name their GPUs cuda:N
        if not torch.cuda.is_available():
            raise DeviceError(
                f"device cuda{'' if index is None else f':{index}'} is not available "
                f"(torch {torch.__version__}); use --device cpu"
            )
        dev = torch.device("cuda", index) if index is not None else torch.device("cuda")
        return lambda out: torch.cuda.synchronize(dev)
    if kind == "mps":
        return lambda out: torch.mps.synchronize()
    if kind == "xpu":
        return lambda out: torch.xpu.synchronize()
    raise DeviceError(f"unknown device kind {kind!r}: expected cpu, cuda[:N], mps, xpu or mlx")


def _mlx_sync() -> Sync:
    try:
        import mlx.core as mx
    except ImportError as e:
        raise DeviceError("device mlx needs MLX: pip install 'mlx[cpu]' (Linux) or 'mlx' (macOS)") from e

    def sync(out: Any) -> None:
        # MLX is lazy: nothing runs until the outputs are evaluated.
        if out is not None:
            mx.eval(out)
        mx.synchronize()

    return sync


def parse_device(device: str) -> tuple[str, int | None]:
    """ "cuda:1" → ("cuda", 1); "cpu" → ("cpu", None)."""
    kind, _, idx = device.partition(":")
    if idx and not idx.isdigit():
        raise DeviceError(f"bad device {device!r}: the index after ':' must be a number")
    return kind, int(idx) if idx else None


def synchronizer(device: str) -> Sync:
    """The function that waits for all queued work on ``device`` (given the last step's output)."""
    kind, index = parse_device(device)
    if kind == "cpu":
        return _no_sync
    if kind == "mlx":
        return _mlx_sync()
    return _torch_sync(kind, index)
