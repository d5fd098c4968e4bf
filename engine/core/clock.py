"""The one clock: every timestamp in the engine (tokens, phase markers, telemetry samples) is
``time.monotonic_ns()``, so series from different sources line up on one axis."""

from __future__ import annotations

import time

now_ns = time.monotonic_ns
