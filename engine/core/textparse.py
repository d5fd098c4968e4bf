"""Values typed as text (CLI flags, ``KEY=VALUE`` settings) read one way everywhere."""

from __future__ import annotations

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def parse_bool(text: str) -> bool:
    """``1/true/yes/on`` → True, ``0/false/no/off`` → False (any case); ValueError otherwise."""
    word = text.strip().lower()
    if word not in _TRUE + _FALSE:
        raise ValueError(f"{text!r} is not a boolean (use one of {', '.join(_TRUE + _FALSE)})")
    return word in _TRUE
