"""Values with units for people: the one formatter the engine's text output uses.

Sizes of things in memory or on disk are binary and labelled so (KiB, MiB, GiB, TiB: powers of
1024), never "MB" for 2**20 bytes. Rates keep the decimal SI prefixes their fields use everywhere
(GB/s, GFLOP/s: powers of 1000, as vendors' datasheets and llama-bench state them). Stored and
exported values stay raw, with the unit in the field name (``peak_mem_bytes``, ``file_size_bytes``):
only text meant to be read is scaled.
"""

from __future__ import annotations

import math

BINARY_PREFIXES = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))
SI_PREFIXES = (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3))
BYTE_UNITS = ("bytes", "B")  # how a Metric's unit names raw bytes


def significant(v: float, digits: int = 4) -> str:
    """About ``digits`` significant digits, never scientific notation for sizes people meet."""
    if not math.isfinite(v):
        return "—"
    a = abs(v)
    if a >= 10 ** (digits - 1):
        return f"{v:,.0f}"
    decimals = digits - 1 - (int(math.floor(math.log10(a))) if a > 0 else 0)
    return f"{v:.{max(0, decimals)}f}"


def count_rate(v: float) -> str:
    """A count per step or token: whole numbers as they are, others to 3 significant digits."""
    return f"{v:,.0f}" if math.isfinite(v) and v == round(v) else significant(v, 3)


def bytes_scale(n: float) -> tuple[float, str]:
    """(divisor, label) of the binary unit that shows ``n`` bytes as 1 ≤ value < 1024."""
    a = abs(n) if math.isfinite(n) else 0.0
    for label, size in BINARY_PREFIXES:
        if a >= size:
            return float(size), label
    return 1.0, "B"


def format_bytes(n: float | None, digits: int = 4) -> str:
    """``751_000_000`` → ``"716.2 MiB"``; ``512`` → ``"512 B"``."""
    if n is None or not math.isfinite(n):
        return "—"
    size, label = bytes_scale(n)
    if size == 1.0:
        return f"{n:.0f} B"
    return f"{significant(n / size, digits)} {label}"


def format_rate(v: float | None, unit: str, digits: int = 4) -> str:
    """A per-second figure with a decimal prefix: ``(1.47e11, "FLOP/s")`` → ``"147.0 GFLOP/s"``,
    ``(4.8e10, "B/s")`` → ``"48.00 GB/s"``."""
    if v is None or not math.isfinite(v):
        return "—"
    for prefix, size in SI_PREFIXES:
        if abs(v) >= size:
            return f"{significant(v / size, digits)} {prefix}{unit}"
    return f"{significant(v, digits)} {unit}"


def display_scale(unit: str, reference: float) -> tuple[float, str]:
    """(divisor, unit label) to show values of ``unit`` near ``reference`` in one column: byte
    units get a binary unit, every other unit is shown as it is."""
    if unit in BYTE_UNITS:
        return bytes_scale(reference)
    return 1.0, unit
