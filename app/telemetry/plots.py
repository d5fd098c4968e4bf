"""Which plots the Telemetry panel draws and which series go on each (data only, no Qt)."""
from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3


@dataclass(frozen=True)
class Line:
    key: str  # series name; "{e}" stands for a GPU entity (gpu0, amd1)
    label: str
    dashed: bool = False


@dataclass(frozen=True)
class PlotSpec:
    key: str
    title: str
    unit: str
    scale: float  # series value × scale = plotted value
    lines: tuple[Line, ...]
    per_gpu: bool = False


HOST_PLOTS = (
    PlotSpec("cpu", "CPU", "%", 1.0, (Line("host.cpu_pct", "host CPU"), Line("engine.cpu_pct", "engine process"))),
    PlotSpec("memory", "Memory", "GiB", 1 / GIB, (Line("host.ram_used_bytes", "RAM used"),
                                                  Line("host.ram_total_bytes", "RAM total", dashed=True),
                                                  Line("engine.rss_bytes", "engine RSS"))),
)
GPU_PLOTS = (
    PlotSpec("gpu_util", "GPU utilization", "%", 1.0, (Line("{e}.util_pct", "{e} util"),), per_gpu=True),
    PlotSpec("gpu_mem", "VRAM", "GiB", 1 / GIB, (Line("{e}.mem_used_bytes", "{e} used"),
                                                 Line("{e}.mem_total_bytes", "{e} total", dashed=True)), per_gpu=True),
    PlotSpec("gpu_power", "GPU power", "W", 1.0, (Line("{e}.power_w", "{e} power"),
                                                  Line("{e}.power_limit_w", "{e} limit", dashed=True)), per_gpu=True),
    PlotSpec("gpu_temp", "GPU temperature", "°C", 1.0, (Line("{e}.temp_c", "{e} temp"),), per_gpu=True),
    PlotSpec("gpu_clock", "GPU clocks", "MHz", 1.0, (Line("{e}.sm_clock_mhz", "{e} SM"),
                                                     Line("{e}.mem_clock_mhz", "{e} memory", dashed=True)), per_gpu=True),
)
LINE_COLORS = ("#3182ce", "#dd6b20", "#38a169", "#d53f8c", "#805ad5", "#d69e2e", "#319795", "#e53e3e")


def lines_for(spec: PlotSpec, entities: list[str]) -> list[tuple[str, str, bool]]:
    """(series name, legend label, dashed) for every line of ``spec`` given the GPU entities."""
    if not spec.per_gpu:
        return [(line.key, line.label, line.dashed) for line in spec.lines]
    return [(line.key.format(e=e), line.label.format(e=e), line.dashed) for e in entities for line in spec.lines]
