"""The default set of sources. Constructing them is free: nothing is imported or initialized until
the sampler opens them."""

from __future__ import annotations

from opscope.engine.telemetry.allocators import MlxSource, TorchCudaSource
from opscope.engine.telemetry.amd import AmdSmiSource
from opscope.engine.telemetry.apple import AppleMemorySource
from opscope.engine.telemetry.base import Source
from opscope.engine.telemetry.host import HostSource
from opscope.engine.telemetry.nvml import NvmlSource


def default_sources(pid: int | None = None, in_process: bool = True, pcie: bool = True) -> list[Source]:
    """Host, NVIDIA and AMD GPUs, Apple's unified memory (macOS), and, when ``in_process`` (the sampler runs in the process that
    runs the model), the torch and MLX allocators of this process.

    ``pid``: the process whose RSS, CPU % and GPU memory are reported (default: this one).
    """
    pids = {pid} if pid else None
    sources: list[Source] = [HostSource(pid), NvmlSource(pids, pcie=pcie), AmdSmiSource(pids), AppleMemorySource(pid)]
    if in_process:
        sources += [TorchCudaSource(), MlxSource()]
    return sources
