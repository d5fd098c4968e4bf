"""engine.units: binary sizes labelled as such, decimal rates, one formatter for the engine's text."""

from __future__ import annotations

import re

import pytest
from opscope.engine.core.units import display_scale, format_bytes, format_rate, significant


@pytest.mark.parametrize(
    "n, text",
    [
        (0, "0 B"),
        (512, "512 B"),
        (1023, "1023 B"),
        (1024, "1.000 KiB"),
        (1536, "1.500 KiB"),
        (7.164e8, "683.2 MiB"),
        (2**30, "1.000 GiB"),
        (98_000_000, "93.46 MiB"),
        (3 * 2**40, "3.000 TiB"),
    ],
)
def test_bytes_are_binary_and_labelled_so(n, text):
    assert format_bytes(n) == text


def test_rates_keep_decimal_prefixes():
    assert format_rate(1.472e11, "FLOP/s") == "147.2 GFLOP/s"
    assert format_rate(3.352e12, "B/s") == "3.352 TB/s"
    assert format_rate(512.0, "B/s") == "512.0 B/s"
    assert format_rate(None, "B/s") == format_bytes(float("nan")) == "—"


def test_significant_digits_and_display_scale():
    assert (significant(0.012345), significant(12345.6), significant(99.99)) == ("0.01235", "12,346", "99.99")
    assert display_scale("bytes", 7.164e8) == (2**20, "MiB")
    assert display_scale("tok/s", 7.164e8) == (1.0, "tok/s")


@pytest.mark.slow
def test_models_inspect_prints_the_file_size_in_mib(default_model_path, capsys):
    from opscope.engine.cli.main import main

    assert main(["models", "inspect", str(default_model_path)]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("file_size "))
    size = default_model_path.stat().st_size
    assert re.search(r"file_size +(\d+\.\d+) MiB$", line), line
    assert float(line.split()[-2]) == pytest.approx(size / 2**20, rel=1e-3)
