"""The JSON every ``--json``/``--format json`` output prints: strict JSON (RFC 8259), which has no
NaN or Infinity. Python's json writes them as bare ``NaN``/``Infinity`` tokens that jq, JavaScript
and most parsers reject; a value that is not a finite number is unknown, so it is written ``null``."""

from __future__ import annotations

import json
import math
from typing import Any


def finite(value: Any) -> Any:
    """``value`` with every float that is NaN or infinite (in dicts, lists, tuples) replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    """json.dumps for what a command prints: non-finite numbers as null, and allow_nan=False so one
    that slips past (a ``default=`` converter's result) fails here, not in the reader's parser."""
    default = kwargs.pop("default", None)
    wrapped = (lambda o: finite(default(o))) if default is not None else None
    return json.dumps(finite(value), allow_nan=False, default=wrapped, **kwargs)
