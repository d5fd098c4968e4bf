"""The peaks MFU and MBU divide by: measured on this device when possible, else a datasheet.

Order of preference: a peak measured by the matmul/bandwidth suites (cached per device), then the
vendor datasheet for a known GPU, then a short measurement made on the spot (and cached). Every
derived metric carries which peak it used, so a % is never read without its denominator.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any

from engine.bench.paths import cache_dir

log = logging.getLogger(__name__)

_FILE = "peaks.json"

# Dense (no sparsity) tensor-core FLOP/s and memory bandwidth from vendor datasheets.
_TF, _TB = 1e12, 1e12
DATASHEET: dict[str, dict[str, float]] = {
    "H200": {"bfloat16": 989 * _TF, "float16": 989 * _TF, "float32": 67 * _TF, "bandwidth": 4.8 * _TB},
    "H100 PCIe": {"bfloat16": 756 * _TF, "float16": 756 * _TF, "float32": 51 * _TF, "bandwidth": 2.0 * _TB},
    "H100": {"bfloat16": 989 * _TF, "float16": 989 * _TF, "float32": 67 * _TF, "bandwidth": 3.35 * _TB},
    "A100-SXM4-80GB": {"bfloat16": 312 * _TF, "float16": 312 * _TF, "float32": 19.5 * _TF, "bandwidth": 2.039 * _TB},
    "A100": {"bfloat16": 312 * _TF, "float16": 312 * _TF, "float32": 19.5 * _TF, "bandwidth": 1.555 * _TB},
    "L4": {"bfloat16": 121 * _TF, "float16": 121 * _TF, "float32": 30.3 * _TF, "bandwidth": 0.3 * _TB},
    "RTX 4090": {"bfloat16": 165 * _TF, "float16": 165 * _TF, "float32": 82.6 * _TF, "bandwidth": 1.008 * _TB},
    "RTX 3090": {"bfloat16": 71 * _TF, "float16": 71 * _TF, "float32": 35.6 * _TF, "bandwidth": 0.936 * _TB},
    "MI300X": {"bfloat16": 1307 * _TF, "float16": 1307 * _TF, "float32": 163 * _TF, "bandwidth": 5.3 * _TB},
}


@dataclass(frozen=True)
class Peak:
    value: float  # FLOP/s or bytes/s
    source: str  # "measured: matmul suite, n=4096" | "datasheet: H100" | "measured-quick: ..."

    def as_params(self, unit_key: str) -> dict[str, Any]:
        return {unit_key: self.value, "peak_source": self.source}


def device_key(device: str) -> str:
    """Which hardware a cached peak belongs to (the CPU model and thread count, or the GPU name)."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        return f"cuda|{torch.cuda.get_device_name(dev)}"
    if dev.type == "cpu":
        from engine.bench.fingerprint import cpu_model

        return f"cpu|{cpu_model()}|threads={torch.get_num_threads()}"
    return dev.type


def _load() -> dict[str, Any]:
    try:
        return json.loads((cache_dir() / _FILE).read_text())
    except (OSError, ValueError):
        return {}


def record(device: str, kind: str, dtype: str | None, value: float, source: str) -> None:
    """Caches a measured peak, keeping the highest seen: a peak is what the hardware can reach, and a
    run on a loaded machine or at a small size must not lower it."""
    from engine.bench.fingerprint import _write_json_atomic

    data = _load()
    entry = data.setdefault(device_key(device), {})
    key = f"{kind}:{dtype or '-'}"
    if key in entry and entry[key]["value"] >= value:
        return
    entry[key] = {"value": value, "source": source, "t": time.time()}
    _write_json_atomic(cache_dir() / _FILE, data)


def cached(device: str, kind: str, dtype: str | None) -> Peak | None:
    hit = _load().get(device_key(device), {}).get(f"{kind}:{dtype or '-'}")
    return Peak(hit["value"], f"measured: {hit['source']}") if hit else None


def datasheet(device: str, kind: str, dtype: str | None) -> Peak | None:
    import torch

    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    name = torch.cuda.get_device_name(dev)
    for key, row in DATASHEET.items():  # ordered: specific names before their prefixes
        if key in name:
            col = "bandwidth" if kind == "bandwidth" else dtype
            return Peak(row[col], f"datasheet: {key}") if col in row else None
    return None


def _measure_quick(device: str, kind: str, dtype: str | None) -> Peak | None:
    """A few seconds of the matmul or bandwidth suite's largest quick point, cached."""
    from engine.bench.runner import RunnerConfig, measure_point
    from engine.bench.suites import bandwidth, matmul

    cfg = RunnerConfig(warmup=1, min_reps=3, min_time_s=0.3, max_reps=50)
    point = (bandwidth.make_point(256 * 2**20, device) if kind == "bandwidth"
             else matmul.make_point(512 if device == "cpu" else 4096, dtype, device))
    out = measure_point(point, cfg)
    if not out.ok:
        log.warning("could not measure the %s peak on %s: %s", kind, device, out.error)
        return None
    import statistics

    value = statistics.median(out.metrics[0].samples) * 1e9  # GFLOP/s or GB/s → per second
    source = f"quick {point.name}"
    record(device, kind, dtype, value, source)
    return Peak(value, f"measured-quick: {source}")


def get(device: str, kind: str, dtype: str | None = None, measure: bool = True) -> Peak | None:
    """The peak for ``kind`` ("matmul" with a dtype, or "bandwidth") on ``device``."""
    if kind == "bandwidth":
        dtype = None
    return cached(device, kind, dtype) or datasheet(device, kind, dtype) or (
        _measure_quick(device, kind, dtype) if measure else None)
