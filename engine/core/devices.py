"""Device and dtype names → torch objects, with errors that say what is available."""

from __future__ import annotations

from typing import TYPE_CHECKING

from opscope.engine.core.errors import ConfigError, DeviceError

if TYPE_CHECKING:
    import torch

DTYPES = ("float32", "bfloat16", "float16")
_ALIASES = {
    "fp32": "float32",
    "f32": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "f16": "float16",
    "half": "float16",
}


def resolve_dtype(name: str) -> torch.dtype:
    import torch

    key = _ALIASES.get(str(name).lower(), str(name).lower())
    if key not in DTYPES:
        raise ConfigError(f"--dtype {name!r} is not supported; use one of {', '.join(DTYPES)}")
    return getattr(torch, key)


def resolve_device(name: str) -> torch.device:
    import torch

    try:
        dev = torch.device(name)
    except (RuntimeError, TypeError) as e:
        raise DeviceError(f"--device {name!r} is not a device name; use cpu, cuda or cuda:N") from e
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(
                f"--device {name}: no CUDA/ROCm GPU is available to this torch build "
                f"({torch.__version__}); use --device cpu"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise DeviceError(f"--device {name}: only {torch.cuda.device_count()} GPU(s) present")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise DeviceError(f"--device {name}: Apple MPS is not available here; use --device cpu")
    elif dev.type not in ("cpu", "cuda", "mps", "meta"):
        raise DeviceError(f"--device {name}: device type {dev.type!r} is not supported (cpu, cuda, mps)")
    return dev


def available_devices() -> list[tuple[str, bool, str]]:
    """(device, available, reason) for the torch backend."""
    import torch

    out = [("cpu", True, "")]
    if torch.cuda.is_available():
        label = "ROCm" if getattr(torch.version, "hip", None) else "CUDA"
        out += [
            (f"cuda:{i}", True, f"{label}: {torch.cuda.get_device_name(i)}") for i in range(torch.cuda.device_count())
        ]
    else:
        out.append(("cuda", False, f"torch {torch.__version__} sees no CUDA/ROCm GPU"))
    return out
