"""The torch backend: a thin wrapper over the built-in engine (engine.api.load) on CPU, CUDA and
ROCm. ROCm builds of torch present AMD GPUs as ``cuda:N``; devices() labels them ``rocm``.

This module imports torch only inside methods, so listing plugins stays cheap.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from opscope.engine import BackendBase, DeviceInfo


class TorchBackend(BackendBase):
    """Backend plugin ``torch`` (see engine.backends.Backend for the contract)."""

    name = "torch"
    load_options = frozenset({"threads", "attention", "fastpath"})

    def is_available(self) -> tuple[bool, str]:
        if importlib.util.find_spec("torch") is None:
            return False, "torch is not installed: pip install torch"
        return True, ""

    def devices(self) -> list[DeviceInfo]:
        from opscope.plugins.torch_backend.devices import torch_devices

        return torch_devices()

    def load_model(self, source: str | Path | None, device: str, dtype: str, **options):
        """engine.api.load. Options: ``threads`` (torch CPU threads), ``attention`` ("sdpa" | "naive"),
        ``fastpath`` ("auto" | "off" | a settings string, see engine.fastpath)."""
        from opscope.engine import load

        return load(source, device=device, dtype=dtype, **options)

    def trace_ops(self, sink):
        """Report every aten op (with its device, shapes and dtypes) to ``sink`` as an OpEvent."""
        from opscope.plugins.torch_backend.trace import trace_ops

        return trace_ops(sink)

    def bench_matmul(
        self, m: int, n: int, k: int, *, device: str = "cpu", dtype: str = "float32", iterations: int = 10
    ) -> list[int]:
        from opscope.plugins.torch_backend.primitives import bench_matmul

        return bench_matmul(m, n, k, device=device, dtype=dtype, iterations=iterations)

    def bench_copy(self, n_bytes: int, *, device: str = "cpu", iterations: int = 10) -> list[int]:
        from opscope.plugins.torch_backend.primitives import bench_copy

        return bench_copy(n_bytes, device=device, iterations=iterations)
