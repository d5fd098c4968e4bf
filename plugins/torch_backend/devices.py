"""The devices torch can run on here, the unavailable ones with the reason."""

from __future__ import annotations

import os

from opscope.engine import DeviceInfo


def torch_devices() -> list[DeviceInfo]:
    import torch

    return [_cpu()] + _gpus(torch) + _mps(torch)


def _cpu() -> DeviceInfo:
    return DeviceInfo("cpu", "cpu", True, description=f"{os.cpu_count()} logical cores")


def _gpus(torch) -> list[DeviceInfo]:
    hip = getattr(torch.version, "hip", None)
    kind, vendor = ("rocm", f"ROCm {hip}") if hip else ("cuda", f"CUDA {torch.version.cuda}")
    if not hip and torch.version.cuda is None:
        return [
            DeviceInfo(
                "cuda",
                "cuda",
                False,
                reason=f"torch {torch.__version__} is a CPU-only build; install a CUDA or ROCm build",
            )
        ]
    if not torch.cuda.is_available():
        gpu = "AMD" if hip else "NVIDIA"
        return [
            DeviceInfo(
                "cuda",
                kind,
                False,
                reason=f"no {gpu} GPU visible to torch {torch.__version__} ({vendor}): "
                f"check the driver and CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES",
            )
        ]
    out = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        out.append(
            DeviceInfo(
                f"cuda:{i}", kind, True, description=f"{props.name} ({vendor})", memory_bytes=int(props.total_memory)
            )
        )
    return out


def _mps(torch) -> list[DeviceInfo]:
    mps = getattr(torch.backends, "mps", None)
    if mps is None or not mps.is_built():
        return []  # not an Apple build: nothing to explain
    ok = mps.is_available()
    return [DeviceInfo("mps", "mps", ok, reason="" if ok else "MPS needs macOS 12.3+ on Apple Silicon")]
