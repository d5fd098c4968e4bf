"""The hardware's theoretical peaks: a ceiling no measurement can pass, stated with its assumptions.

CPU: cores × max clock × FLOP per cycle per core, the ISA read at run time from /proc/cpuinfo:

| flags | fp32 FLOP/cycle/core | assumption |
| --- | --- | --- |
| avx512f | 2 units × 16 lanes × 2 (FMA) = 64 | two 512-bit FMA units (many Xeon Silver/Bronze |
|  |  | have one; Zen 4 splits 512-bit ops in two halves: their real ceiling is half) |
| avx2 + fma | 2 × 8 × 2 = 32 | two 256-bit FMA units |
| avx | 8 + 8 = 16 | one add and one multiply port, no FMA |
| sse2 | 4 + 4 = 8 | as above at 128 bits |
| asimd (Arm) | 2 × 4 × 2 = 16 | two 128-bit FMA pipes (Apple cores have four) |

bfloat16: ``amx_bf16`` 1024 FLOP/cycle/core (Intel AMX), ``avx512_bf16`` twice the fp32 rate
(VDPBF16PS), else the fp32 rate (the math runs in fp32). float16 likewise with ``amx_fp16`` and
``avx512_fp16``. Where a figure is uncertain the larger one is taken: a theoretical peak is only
useful as a ceiling. Cores: physical cores this process may run on (hyperthreads share the FMA
units), at most the torch thread count. Clock: ``cpuinfo_max_freq`` (boost included) when the
kernel exposes cpufreq, else the largest ``cpu MHz`` in /proc/cpuinfo times ``TURBO_ALLOWANCE``:
without cpufreq (a VM) ``cpu MHz`` is the nominal clock, and turbo runs past it (this project's VM
says 2300 MHz, and one thread's float32 matmul reached 158 GFLOP/s = 69 FLOP per nominal cycle,
above the 64 AVX-512 allows). Current x86 parts turbo up to about twice their base clock (Xeon
8480+ 2.0 -> 3.8 GHz, Core i9-13900K 3.0 -> 5.8 GHz), so 2x keeps the figure a ceiling.

NVIDIA GPUs: dense (no sparsity) datasheet figures at the datasheet boost clock, scaled by the
maximum SM clock NVML reports for this board; memory bandwidth from NVML's maximum memory clock and
bus width (2 transfers per clock), the datasheet figure where NVML cannot say.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROC_CPUINFO = Path("/proc/cpuinfo")
SYS_CPU = Path("/sys/devices/system/cpu")
TURBO_ALLOWANCE = 2.0  # on the nominal "cpu MHz" clock when no cpufreq maximum is exposed


@dataclass(frozen=True)
class Isa:
    name: str
    fp32_flop_per_cycle: int
    assumption: str


_ISAS = (  # first match wins
    (("avx512f",), Isa("AVX-512", 64, "2 FMA units × 16 fp32 lanes × 2")),
    (("avx2", "fma"), Isa("AVX2+FMA", 32, "2 FMA units × 8 fp32 lanes × 2")),
    (("avx",), Isa("AVX", 16, "1 add + 1 multiply port × 8 fp32 lanes")),
    (("sse2",), Isa("SSE2", 8, "1 add + 1 multiply port × 4 fp32 lanes")),
    (("asimd",), Isa("NEON", 16, "2 FMA pipes × 4 fp32 lanes × 2")),
)
_HALF = {  # dtype -> ((flag, FLOP/cycle/core or None = 2× fp32, name), ...)
    "bfloat16": (("amx_bf16", 1024, "AMX-BF16"), ("avx512_bf16", None, "AVX512-BF16")),
    "float16": (("amx_fp16", 1024, "AMX-FP16"), ("avx512_fp16", None, "AVX512-FP16")),
}


@dataclass(frozen=True)
class CpuSpec:
    model: str
    cores: int  # physical cores usable by this process
    hz: float
    clock_source: str
    flags: frozenset[str]

    @property
    def isa(self) -> Isa | None:
        for needed, isa in _ISAS:
            if all(f in self.flags for f in needed):
                return isa
        return None

    def flop_per_cycle(self, dtype: str) -> tuple[float, str] | None:
        """(FLOP per cycle per core, how it was worked out) for ``dtype``; None for an unknown ISA."""
        isa = self.isa
        if isa is None:
            return None
        for flag, per_cycle, name in _HALF.get(dtype, ()):
            if flag in self.flags:
                if per_cycle is None:
                    return 2.0 * isa.fp32_flop_per_cycle, f"{name}: 2× the {isa.name} fp32 rate ({isa.assumption})"
                return float(per_cycle), f"{name} tiles"
        return float(isa.fp32_flop_per_cycle), f"{isa.name}: {isa.assumption}"


def _cpuinfo_blocks(path: Path) -> list[dict[str, str]]:
    try:
        text = path.read_text()
    except OSError:
        return []
    blocks = []
    for chunk in text.strip().split("\n\n"):
        fields = {}
        for line in chunk.splitlines():
            key, sep, value = line.partition(":")
            if sep:
                fields[key.strip()] = value.strip()
        blocks.append(fields)
    return blocks


def _max_clock(blocks: list[dict[str, str]], sys_cpu: Path) -> tuple[float, str] | None:
    try:
        khz = int((sys_cpu / "cpu0" / "cpufreq" / "cpuinfo_max_freq").read_text().strip())
        return khz * 1e3, "cpuinfo_max_freq"
    except (OSError, ValueError):
        pass
    mhz = [float(b["cpu MHz"]) for b in blocks if _is_float(b.get("cpu MHz"))]
    if not mhz:
        return None
    return (
        max(mhz) * 1e6 * TURBO_ALLOWANCE,
        f"{TURBO_ALLOWANCE:g} × {max(mhz) / 1e3:.2f} GHz cpu MHz: turbo allowance, no cpufreq maximum",
    )


def _is_float(text: str | None) -> bool:
    try:
        float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return True


def _physical_cores(blocks: list[dict[str, str]], usable: set[int] | None) -> int:
    cpus = [b for b in blocks if "processor" in b and (usable is None or int(b["processor"]) in usable)]
    ids = {(b.get("physical id"), b.get("core id")) for b in cpus}
    if cpus and all(b.get("core id") is not None for b in cpus):
        return len(ids)
    return len(cpus) or (len(usable) if usable else os.cpu_count() or 1)


def _usable_cpus() -> set[int] | None:
    return set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


def cpu_spec(
    cpuinfo: Path = PROC_CPUINFO, sys_cpu: Path = SYS_CPU, usable: set[int] | None | str = "self"
) -> CpuSpec | None:
    """What the theoretical CPU peak is built from; None where /proc/cpuinfo cannot say."""
    blocks = [b for b in _cpuinfo_blocks(cpuinfo) if "processor" in b]
    clock = _max_clock(blocks, sys_cpu)
    if not blocks or clock is None:
        return None
    first = blocks[0]
    flags = frozenset((first.get("flags") or first.get("Features") or "").split())
    model = first.get("model name") or first.get("Model") or first.get("CPU part") or "unknown CPU"
    cpus = _usable_cpus() if isinstance(usable, str) else usable  # "self": this process's CPUs
    return CpuSpec(model, _physical_cores(blocks, cpus), clock[0], clock[1], flags)


def cpu_flop_s(spec: CpuSpec, dtype: str, threads: int | None = None) -> tuple[float, str] | None:
    """(FLOP/s, the whole derivation in words) of ``spec`` for ``dtype`` on ``threads`` threads."""
    per = spec.flop_per_cycle(dtype)
    if per is None:
        return None
    cores = min(spec.cores, threads) if threads else spec.cores
    value = cores * spec.hz * per[0]
    how = (
        f"{cores} core{'s' if cores != 1 else ''} × {spec.hz / 1e9:.2f} GHz ({spec.clock_source}) × "
        f"{per[0]:g} FLOP/cycle ({per[1]}), {spec.model}"
    )
    return value, how


# Vendor datasheets, dense tensor-core figures (no 2:4 sparsity), at the boost clock given.
# Matched against the NVML name as a whole word; more specific names first.
_T = 1e12


def _gpu(boost_mhz: float, fp32_tf: float, half_tf: float, bw_tb_s: float, bf16: bool = True) -> dict[str, float]:
    row = {"boost_mhz": boost_mhz, "float32": fp32_tf * _T, "float16": half_tf * _T, "bandwidth": bw_tb_s * _T}
    return row | ({"bfloat16": half_tf * _T} if bf16 else {})


GPU_DATASHEET: tuple[tuple[str, dict[str, float]], ...] = (  # boost MHz, fp32, fp16/bf16 TFLOP/s, TB/s
    ("H200", _gpu(1980, 67, 989, 4.8)),
    ("H100 PCIe", _gpu(1755, 51, 756, 2.0)),
    ("H100 NVL", _gpu(1785, 60, 835, 3.9)),
    ("H100", _gpu(1980, 67, 989, 3.35)),
    ("A100-SXM4-80GB", _gpu(1410, 19.5, 312, 2.039)),
    ("A100 80GB PCIe", _gpu(1410, 19.5, 312, 1.935)),
    ("A100", _gpu(1410, 19.5, 312, 1.555)),
    ("A10", _gpu(1695, 31.2, 125, 0.6)),
    ("L40S", _gpu(2520, 91.6, 362, 0.864)),
    ("L4", _gpu(2040, 30.3, 121, 0.3)),
    ("RTX 4090", _gpu(2520, 82.6, 165.2, 1.008)),
    ("RTX 3090", _gpu(1695, 35.6, 71, 0.936)),
    ("V100", _gpu(1530, 15.7, 125, 0.9, bf16=False)),
    ("T4", _gpu(1590, 8.1, 65, 0.32, bf16=False)),
    ("MI300X", _gpu(2100, 163.4, 1307, 5.3)),  # AMD under ROCm torch: datasheet clocks (no NVML)
)


def datasheet_row(gpu_name: str) -> tuple[str, dict[str, float]] | None:
    for key, row in GPU_DATASHEET:
        if re.search(rf"(?<![\w]){re.escape(key)}(?![\w])", gpu_name):
            return key, row
    return None


@dataclass(frozen=True)
class GpuClocks:
    name: str
    max_sm_mhz: float | None = None
    max_mem_mhz: float | None = None
    bus_width_bits: float | None = None


def gpu_peak(clocks: GpuClocks, kind: str, dtype: str | None) -> tuple[float, str] | None:
    """(value, derivation) of the matmul (per dtype) or bandwidth peak of a known NVIDIA GPU."""
    found = datasheet_row(clocks.name)
    if found is None:
        return None
    key, row = found
    if kind == "bandwidth":
        if clocks.max_mem_mhz and clocks.bus_width_bits:
            value = 2.0 * clocks.max_mem_mhz * 1e6 * clocks.bus_width_bits / 8
            return value, (
                f"{clocks.name}: 2 × {clocks.max_mem_mhz:.0f} MHz memory clock × "
                f"{clocks.bus_width_bits:.0f}-bit bus (NVML)"
            )
        return row["bandwidth"], f"datasheet {key}"
    if dtype not in row:
        return None
    if clocks.max_sm_mhz:
        scale = clocks.max_sm_mhz / row["boost_mhz"]
        return row[dtype] * scale, (
            f"datasheet {key} {dtype} dense at {row['boost_mhz']:.0f} MHz × "
            f"{clocks.max_sm_mhz:.0f} MHz max SM clock (NVML)"
        )
    return row[dtype], f"datasheet {key} {dtype} dense at its {row['boost_mhz']:.0f} MHz boost clock"


def _nvml_index(torch_index: int) -> int:
    """NVML counts every GPU; CUDA_VISIBLE_DEVICES=2,3 makes torch's cuda:0 NVML's index 2."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    ids = [v.strip() for v in visible.split(",") if v.strip()]
    if ids and all(v.isdigit() for v in ids) and torch_index < len(ids):
        return int(ids[torch_index])
    return torch_index


def nvml_clocks(torch_index: int, nvml: Any = None) -> GpuClocks | None:
    """Name and maximum clocks of a GPU from NVML (engine.telemetry.nvml's wrapper); None without NVML."""
    from opscope.engine.telemetry.nvml import Nvml

    nv = nvml or Nvml()
    try:
        return _read_clocks(nv, torch_index) if nv.init() else None
    finally:
        if nvml is None:
            nv.shutdown()


def _read_clocks(nv: Any, torch_index: int) -> GpuClocks | None:
    import pynvml
    from opscope.engine.telemetry.base import NA

    h = nv.query("nvmlDeviceGetHandleByIndex", _nvml_index(torch_index))
    if h is NA:
        return None

    def num(func: str, *args) -> float | None:
        v = nv.query(func, h, *args)
        return None if v is NA or not v else float(v)

    name = nv.query("nvmlDeviceGetName", h)
    if name is NA:
        return None
    name = name.decode() if isinstance(name, bytes) else str(name)
    return GpuClocks(
        name,
        num("nvmlDeviceGetMaxClockInfo", pynvml.NVML_CLOCK_SM),
        num("nvmlDeviceGetMaxClockInfo", pynvml.NVML_CLOCK_MEM),
        num("nvmlDeviceGetMemoryBusWidth"),
    )
