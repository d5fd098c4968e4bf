"""What every telemetry source shares: the N/A sentinel, the Source contract, the Snapshot.

A source never raises into its caller (nvitop's habit): a field the hardware or driver does not
report is ``NA`` at the query layer and NaN in series, and the reason is logged once.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)


class _NotAvailable:
    """A value the hardware or driver does not report. Falsy, prints as ``N/A``, NaN as a float."""

    _instance: _NotAvailable | None = None

    def __new__(cls) -> _NotAvailable:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "N/A"

    def __bool__(self) -> bool:
        return False

    def __float__(self) -> float:
        return math.nan

    def __reduce__(self):  # pickles (worker process → GUI) back to the singleton
        return (_NotAvailable, ())


NA = _NotAvailable()


def to_float(value: Any) -> float:
    """A sample value as a float: NA, None, strings such as amdsmi's "N/A" and booleans become NaN
    (booleans would silently read as 0/1 percent)."""
    if isinstance(value, bool) or value is None or value is NA:
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


class LogOnce:
    """Logs a message the first time its key is seen: a field that is not supported fails on every
    tick, and one line per tick would drown the log."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._seen: set[tuple] = set()
        self._lock = threading.Lock()

    def __call__(self, key: tuple, level: int, msg: str, *args: Any) -> bool:
        with self._lock:
            if key in self._seen:
                return False
            self._seen.add(key)
        self._logger.log(level, msg, *args)
        return True


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One tick of the sampler: every available series' value at ``t_ns`` (engine clock).

    ``tick`` is k in the schedule ``start_ns + k * period_ns`` (-1 for an off-schedule sample
    taken by ``Sampler.sample_now``); ``sample_ns`` is how long reading all sources took.
    """

    t_ns: int
    tick: int
    values: Mapping[str, float]
    sample_ns: int = 0


class Source:
    """One kind of telemetry (host, NVIDIA GPUs, ...). Subclasses implement ``_open`` and ``_sample``.

    Lifecycle: constructing imports nothing and touches no driver; ``open()`` does the lazy work
    once (import, driver init, device discovery) and fills ``units``; ``sample()`` returns one
    snapshot ``{series name: value}`` per call; ``close()`` releases the driver. ``open`` and
    ``sample`` never raise: failures make the source unavailable with a ``reason``.
    """

    name = "source"

    def __init__(self) -> None:
        self.available = False
        self.reason = "not opened"
        # True when the source is unavailable only because its optional package is not
        # installed: the CLI stays quiet about that (an NVIDIA user need not hear amdsmi is missing).
        self.missing_package = False
        self.units: dict[str, str] = {}  # series name -> unit, known after open()

    def open(self) -> bool:
        try:
            self._open()
        except Exception as e:  # a broken driver must not stop the other sources
            log.warning("telemetry source %s failed to open: %s", self.name, e, exc_info=True)
            self._unavailable(f"{self.name}: failed to open ({e})")
        return self.available

    def sample(self) -> dict[str, float]:
        if not self.available:
            return {}
        return self._sample()

    def close(self) -> None:
        self.available = False

    def status(self) -> str:
        """ "ok" or why the source (or part of it) is not sampled."""
        return "ok" if self.available else self.reason

    def _ready(self, units: dict[str, str]) -> None:
        self.units = dict(units)
        self.available = True
        self.reason = "ok"

    def _unavailable(self, reason: str, missing_package: bool = False) -> None:
        self.available = False
        self.reason = reason
        self.missing_package = missing_package

    def _open(self) -> None:
        raise NotImplementedError

    def _sample(self) -> dict[str, float]:
        raise NotImplementedError
