"""The one clock: every timestamp in the engine (tokens, phase markers, telemetry samples) is
``time.monotonic_ns()``, so series from different sources line up on one axis."""
from __future__ import annotations

import time

now_ns = time.monotonic_ns


def ns_to_ms(ns: int | float) -> float:
    return ns / 1e6
