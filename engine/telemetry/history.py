"""Bounded history of every series: one preallocated ring of timestamps shared by all series (they
are sampled together, one tick at a time) and one ring of values per series.

Memory is fixed at construction: ``capacity * (8 + 8 * n_series)`` bytes, e.g. one hour at 10 Hz
(36,000 ticks) of 20 series is 6.0 MB. Values are stored series-major (one contiguous row per
series) because readers (GUI plots, recorders) read a series at a time and the writer touches one
column per tick. All methods are thread-safe: the sampler thread writes while a GUI thread reads.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping

import numpy as np


class History:
    def __init__(self, capacity: int, names: Iterable[str] = ()) -> None:
        if capacity < 1:
            raise ValueError(f"history capacity must be >= 1, got {capacity}")
        self.capacity = int(capacity)
        self._t_ns = np.zeros(self.capacity, dtype=np.int64)
        self._values = np.full((0, self.capacity), math.nan, dtype=np.float64)
        self._cols: dict[str, int] = {}
        self._written = 0  # total ticks ever appended; the ring index is written % capacity
        self._lock = threading.Lock()
        for name in names:
            self._add_column(name)

    def __len__(self) -> int:
        return min(self._written, self.capacity)

    @property
    def nbytes(self) -> int:
        return self._t_ns.nbytes + self._values.nbytes

    def names(self) -> list[str]:
        with self._lock:
            return list(self._cols)

    def append(self, t_ns: int, values: Mapping[str, float]) -> None:
        """Store one tick. A series missing from ``values`` gets NaN at this tick; a new name gets
        a new row (NaN for its past)."""
        with self._lock:
            i = self._written % self.capacity
            self._t_ns[i] = t_ns
            self._values[:, i] = math.nan
            for name, value in values.items():
                col = self._cols.get(name)
                if col is None:
                    col = self._add_column(name)
                self._values[col, i] = value
            self._written += 1

    def series(
        self, name: str, since_ns: int | None = None, until_ns: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(t_ns, values) of one series in time order, copies; optionally only samples with
        ``since_ns <= t_ns <= until_ns``. Unknown name: KeyError."""
        with self._lock:
            col = self._cols[name]
            order = self._order()
            # np.array() copies: a slice would be a view the writer keeps changing
            t_ns = np.array(self._t_ns[order])
            values = np.array(self._values[col, order])
        return _cut(t_ns, values, since_ns, until_ns)

    def oldest_ns(self) -> int | None:
        with self._lock:
            if not self._written:
                return None
            # before the ring wraps the oldest is slot 0; after, the slot about to be overwritten
            first = 0 if self._written <= self.capacity else self._written % self.capacity
            return int(self._t_ns[first])

    def _order(self) -> np.ndarray | slice:
        """Indices that put the ring in time order (a plain slice until it wraps)."""
        n = self._written
        if n <= self.capacity:
            return slice(0, n)
        start = n % self.capacity
        return np.concatenate([np.arange(start, self.capacity), np.arange(0, start)])

    def _add_column(self, name: str) -> int:
        row = np.full((1, self.capacity), math.nan, dtype=np.float64)
        self._values = np.vstack([self._values, row])
        self._cols[name] = len(self._cols)
        return self._cols[name]


def _cut(
    t_ns: np.ndarray, values: np.ndarray, since_ns: int | None, until_ns: int | None
) -> tuple[np.ndarray, np.ndarray]:
    lo = 0 if since_ns is None else int(np.searchsorted(t_ns, since_ns, side="left"))
    hi = len(t_ns) if until_ns is None else int(np.searchsorted(t_ns, until_ns, side="right"))
    return t_ns[lo:hi], values[lo:hi]
