"""Which plots the Telemetry panel draws and which series go on each (data only, no Qt)."""

from __future__ import annotations

import os
from dataclasses import dataclass

GIB = 1024**3
MIB = 1024**2
CORES = os.cpu_count() or 1
REASONS_SUFFIX = "#"  # "gpu0.clock_event_reasons#sw_pwr": one lane of the reasons bitmask


@dataclass(frozen=True)
class Line:
    key: str  # series name; "{e}" stands for a GPU entity (gpu0, amd1)
    label: str
    dashed: bool = False
    scale: float = 1.0  # on top of the plot's: puts a series on the plot's scale


@dataclass(frozen=True)
class PlotSpec:
    key: str
    title: str
    unit: str
    scale: float  # series value × scale = plotted value
    lines: tuple[Line, ...]
    per_gpu: bool = False
    lanes: bool = False  # a bitmask series drawn as one lane per set bit (clock-event reasons)


HOST_PLOTS = (
    # Both lines in % of the whole machine: psutil gives the process 100 % per busy core.
    PlotSpec(
        "cpu",
        "CPU",
        f"% of all {CORES} cores",
        1.0,
        (Line("host.cpu_pct", "host CPU"), Line("engine.cpu_pct", "engine process", scale=1 / CORES)),
    ),
    PlotSpec(
        "memory",
        "Memory",
        "GiB",
        1 / GIB,
        (
            Line("host.ram_used_bytes", "RAM used"),
            Line("host.ram_total_bytes", "RAM total", dashed=True),
            Line("engine.rss_bytes", "engine RSS"),
        ),
    ),
)
GPU_PLOTS = (
    PlotSpec("gpu_util", "GPU utilization", "%", 1.0, (Line("{e}.util_pct", "{e} util"),), per_gpu=True),
    PlotSpec(
        "gpu_mem",
        "VRAM",
        "GiB",
        1 / GIB,
        (
            Line("{e}.mem_used_bytes", "{e} used"),
            Line("{e}.proc_mem_bytes", "{e} engine process"),
            Line("{e}.mem_total_bytes", "{e} total", dashed=True),
        ),
        per_gpu=True,
    ),
    PlotSpec(
        "gpu_power",
        "GPU power",
        "W",
        1.0,
        (Line("{e}.power_w", "{e} power"), Line("{e}.power_limit_w", "{e} limit", dashed=True)),
        per_gpu=True,
    ),
    PlotSpec("gpu_temp", "GPU temperature", "°C", 1.0, (Line("{e}.temp_c", "{e} temp"),), per_gpu=True),
    PlotSpec(
        "gpu_clock",
        "GPU clocks",
        "MHz",
        1.0,
        (Line("{e}.sm_clock_mhz", "{e} SM"), Line("{e}.mem_clock_mhz", "{e} memory", dashed=True)),
        per_gpu=True,
    ),
    PlotSpec(
        "gpu_pcie",
        "PCIe throughput",
        "MiB/s",
        1 / MIB,
        (Line("{e}.pcie_tx_bytes_s", "{e} TX (to host)"), Line("{e}.pcie_rx_bytes_s", "{e} RX (to GPU)", dashed=True)),
        per_gpu=True,
    ),
    PlotSpec(
        "gpu_reasons",
        "Clock throttle reasons",
        "active",
        1.0,
        (Line("{e}.clock_event_reasons", "{e}"),),
        per_gpu=True,
        lanes=True,
    ),
)
LINE_COLORS = ("#3182ce", "#dd6b20", "#38a169", "#d53f8c", "#805ad5", "#d69e2e", "#319795", "#e53e3e")


def reason_names() -> list[str]:
    from opscope.engine import NVML_REASON_BITS as REASON_BITS

    return [name for _bit, name in REASON_BITS]


def lines_for(spec: PlotSpec, entities: list[str]) -> list[tuple[str, str, bool]]:
    """(series name, legend label, dashed) for every line of ``spec`` given the GPU entities; a lanes
    plot has one line per reason bit, named ``<series>#<reason>``."""
    if not spec.per_gpu:
        return [(line.key, line.label, line.dashed) for line in spec.lines]
    lines = [(line.key.format(e=e), line.label.format(e=e), line.dashed) for e in entities for line in spec.lines]
    if spec.lanes:
        return [
            (f"{key}{REASONS_SUFFIX}{r}", f"{label} {r}", False) for key, label, _d in lines for r in reason_names()
        ]
    return lines


def line_scale(spec: PlotSpec, key: str) -> float:
    """Plotted value = series value × this, for the series ``key`` on ``spec``."""
    line = next((ln for ln in spec.lines if ln.key.replace("{e}.", "") == key.split(".", 1)[-1] or ln.key == key), None)
    return spec.scale * (line.scale if line else 1.0)
