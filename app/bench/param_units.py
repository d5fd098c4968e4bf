"""Byte sizes in the Benchmarks panel as a person reads and types them ("64 MiB"). A parameter's
label, unit and tooltip come from the suite itself (``param`` in engine/bench/measure/params.py,
sent in the worker's suite catalog)."""

from __future__ import annotations

_BINARY = (("GiB", 30), ("MiB", 20), ("KiB", 10))


def format_size(n: int) -> str:
    """An exact byte count as a person types it: 67108864 → "64 MiB", 1000 → "1000 B"."""
    for unit, shift in _BINARY:
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def parse_size(text: str) -> int:
    """ "64 MiB", "64MiB", "1.5 KiB", "4096" or "4096 B" → bytes; ValueError naming the text."""
    t = text.strip().replace(" ", "")
    for unit, shift in _BINARY + (("B", 0),):
        if t.lower().endswith(unit.lower()):
            number = float(t[: -len(unit)])
            if not (number * (1 << shift)).is_integer():
                raise ValueError(f"{text!r} is not a whole number of bytes")
            return int(number * (1 << shift))
    return int(t)
