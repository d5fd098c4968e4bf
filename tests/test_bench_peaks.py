"""Where MFU/MBU peaks come from: the cache (highest kept), a datasheet, or a quick measurement."""
from __future__ import annotations

import pytest

from engine.bench import peaks


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("OPSCOPE_CACHE_DIR", str(tmp_path / "cache"))


def test_cache_keeps_the_highest_peak_per_device_and_dtype():
    peaks.record("cpu", "matmul", "bfloat16", 200e9, "full run")
    peaks.record("cpu", "matmul", "bfloat16", 50e9, "busy machine")
    peaks.record("cpu", "matmul", "float32", 90e9, "fp32 run")
    assert peaks.get("cpu", "matmul", "bfloat16", measure=False) == peaks.Peak(200e9, "measured: full run")
    assert peaks.get("cpu", "matmul", "float32", measure=False).value == 90e9
    assert peaks.get("cpu", "bandwidth", measure=False) is None  # nothing known, nothing measured


@pytest.mark.parametrize("gpu, key, bf16_tflops", [
    ("NVIDIA H100 80GB HBM3", "H100", 989), ("NVIDIA H100 PCIe", "H100 PCIe", 756),
    ("NVIDIA H200", "H200", 989), ("NVIDIA A100-SXM4-80GB", "A100-SXM4-80GB", 312)])
def test_datasheet_for_known_gpus(monkeypatch, gpu, key, bf16_tflops):
    import torch

    # No GPU here: the one torch.cuda call the lookup makes is faked with the real signature.
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: gpu)
    peak = peaks.datasheet("cuda:0", "matmul", "bfloat16")
    assert peak == peaks.Peak(bf16_tflops * 1e12, f"datasheet: {key}")
    assert peaks.datasheet("cuda:0", "bandwidth", None).source == f"datasheet: {key}"


def test_no_datasheet_for_a_cpu():
    assert peaks.datasheet("cpu", "matmul", "float32") is None


@pytest.mark.slow
def test_missing_peak_is_measured_quickly_and_cached():
    peak = peaks.get("cpu", "bandwidth")
    assert peak.value > 1e8 and peak.source == "measured-quick: quick copy_256MiB"
    assert peaks.cached("cpu", "bandwidth", None).value == peak.value
