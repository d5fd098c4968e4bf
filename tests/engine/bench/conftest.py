"""Fixtures of the benchmark tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def known_peaks(cache_dir) -> Path:
    """Peaks on record for the CPU (matmul in every dtype, bandwidth), so MFU/MBU have a
    denominator without measuring. Returns the cache that holds them."""
    from opscope.engine.bench.ceilings import peaks

    for dt in ("float32", "bfloat16", "float16"):
        peaks.record("cpu", "matmul", dt, 100e9, "test")
    peaks.record("cpu", "bandwidth", None, 10e9, "test")
    return cache_dir
