"""The MLX backend: Llama-family models in mlx.nn, for Apple Silicon (Metal) and, through
``mlx[cpu]``, Linux CPUs (correct there, not fast).

This module stays importable without mlx: mlx is imported on first use, and ``is_available()``
says how to install it when it is missing.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from opscope.engine import BackendBase, DeviceInfo

INSTALL_HINT = "pip install 'mlx[cpu]' on Linux, or pip install mlx on Apple Silicon"


class MLXBackend(BackendBase):
    """Backend plugin ``mlx`` (see engine.backends.Backend for the contract)."""

    name = "mlx"
    load_options = frozenset({"threads", "attention"})

    def is_available(self) -> tuple[bool, str]:
        if importlib.util.find_spec("mlx") is None:
            return False, f"mlx is not installed: {INSTALL_HINT}"
        try:
            import mlx.core  # noqa: F401  the wheel may lack a backend for this machine
        except (ImportError, OSError) as e:
            return False, f"mlx is installed but does not load here ({e}): {INSTALL_HINT}"
        return True, ""

    def devices(self) -> list[DeviceInfo]:
        import mlx.core as mx

        out = [DeviceInfo("cpu", "cpu", mx.is_available(mx.cpu), description=f"mlx {mx.__version__}")]
        has_gpu = mx.is_available(mx.gpu)
        kind = "metal" if mx.metal.is_available() else "gpu"
        out.append(
            DeviceInfo(
                "gpu",
                kind,
                has_gpu,
                reason=""
                if has_gpu
                else f"this mlx build ({mx.__version__}) has no GPU backend here (Metal needs Apple Silicon)",
            )
        )
        return out

    def load_model(self, source: str | Path | None, device: str, dtype: str, **options):
        """Load a GGUF file or a Hugging Face safetensors directory (None: the default model).
        Options: ``threads`` (ignored: mlx picks its own), ``attention`` ("sdpa" only)."""
        from opscope.plugins.mlx_backend.loaded import load

        return load(source, device=device, dtype=dtype, **options)

    def conversion(self, types: dict[str, int]) -> list[str]:
        """How each quantized GGUF type reaches MLX at load ('Q4_K → MLX 4-bit g32: exact', ...)."""
        from opscope.plugins.mlx_backend.convert import summary

        return summary(types)

    def trace_ops(self, sink):
        """Report every MLX function and array operator call to ``sink`` as an OpEvent."""
        from opscope.plugins.mlx_backend.trace import trace_ops

        return trace_ops(sink)

    def bench_matmul(
        self, m: int, n: int, k: int, *, device: str = "cpu", dtype: str = "float32", iterations: int = 10
    ) -> list[int]:
        from opscope.plugins.mlx_backend.primitives import bench_matmul

        return bench_matmul(m, n, k, device=device, dtype=dtype, iterations=iterations)

    def bench_copy(self, n_bytes: int, *, device: str = "cpu", iterations: int = 10) -> list[int]:
        from opscope.plugins.mlx_backend.primitives import bench_copy

        return bench_copy(n_bytes, device=device, iterations=iterations)
