"""The sampler: a background thread that reads every source once per tick on a drift-free schedule
(tick k fires at ``start_ns + k * period_ns``, never "sleep one period after the last one"), keeps
a bounded history per series and calls subscribers with each Snapshot.

Threading contract for the GUI: subscribers are called *on the sampler thread*, right after the
tick is stored; they must be quick and hand off (a Qt signal, a queue). ``series()``,
``series_names()``, ``units`` and ``latest`` are safe to call from any thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from types import MappingProxyType

import numpy as np
from opscope.engine.core.clock import now_ns
from opscope.engine.core.errors import ConfigError
from opscope.engine.telemetry.base import LogOnce, Snapshot, Source
from opscope.engine.telemetry.history import History

log = logging.getLogger(__name__)
_once = LogOnce(log)

MIN_INTERVAL_MS = 20.0  # 50 Hz: above that, psutil's 10 ms jiffies make CPU % meaningless
MAX_INTERVAL_MS = 60_000.0
Subscriber = Callable[[Snapshot], None]


class Sampler:
    def __init__(
        self, sources: Sequence[Source] | None = None, interval_ms: float = 100.0, *, history_s: float = 3600.0
    ) -> None:
        if not MIN_INTERVAL_MS <= interval_ms <= MAX_INTERVAL_MS:
            raise ConfigError(
                f"telemetry interval {interval_ms} ms is outside "
                f"{MIN_INTERVAL_MS:g}..{MAX_INTERVAL_MS:g} ms (50 Hz .. 1/min)"
            )
        if history_s <= 0:
            raise ConfigError(f"telemetry history must be > 0 s, got {history_s}")
        if sources is None:
            from opscope.engine.telemetry.sources import default_sources

            sources = default_sources()
        self.sources = list(sources)
        self.period_ns = int(interval_ms * 1e6)
        self.history = History(max(1, int(history_s * 1e9 / self.period_ns)))
        self.start_ns = 0  # tick 0 of the schedule, set by start()
        self.ticks = 0  # on-schedule ticks taken
        self.missed_ticks = 0  # schedule slots skipped because a tick overran (busy machine)
        self.latest: Snapshot | None = None
        self._subscribers: list[Subscriber] = []
        self._failed_subscribers: set[int] = set()
        self._lock = threading.Lock()  # subscribers list
        self._tick_lock = threading.Lock()  # sources are read by one thread at a time
        self._stop = threading.Event()
        self._resume = threading.Event()
        self._resume.set()
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._opened = False

    # --- lifecycle -------------------------------------------------------------------------
    def start(self, wait: bool = True, timeout_s: float = 10.0) -> Sampler:
        """Start the thread. Sources are opened on it (driver init can take a while); with
        ``wait`` this returns once they are open, so ``units`` and ``series_names`` are known."""
        if self._thread is not None:
            raise ConfigError("this sampler is already started; a stopped sampler cannot restart")
        self._thread = threading.Thread(target=self._run, name="opscope-telemetry", daemon=True)
        self._thread.start()
        if wait:
            self._ready.wait(timeout_s)
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop ticking, join the thread, close every source. Idempotent."""
        self._stop.set()
        self._resume.set()  # a paused thread must wake to see the stop
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                log.warning("telemetry thread did not stop within %.1f s", timeout_s)
        self._close_sources()

    def pause(self) -> None:
        """Stop sampling (no cost while paused) until resume(); history is kept."""
        self._resume.clear()

    def resume(self) -> None:
        self._resume.set()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stop.is_set()

    @property
    def paused(self) -> bool:
        return not self._resume.is_set()

    def __enter__(self) -> Sampler:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- reading ---------------------------------------------------------------------------
    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Call ``callback(snapshot)`` on the sampler thread after every tick; returns the
        function that unsubscribes."""
        with self._lock:
            self._subscribers.append(callback)

        def unsubscribe() -> None:
            with self._lock:
                if callback in self._subscribers:
                    self._subscribers.remove(callback)

        return unsubscribe

    def series(
        self, name: str, since_ns: int | None = None, until_ns: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(t_ns int64 array, values float64 array, NaN = not available), oldest first."""
        return self.history.series(name, since_ns, until_ns)

    def series_names(self) -> list[str]:
        return self.history.names()

    @property
    def units(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for source in self.sources:
            out.update(source.units)
        return out

    def status(self) -> dict[str, str]:
        """Per source: "ok", or why it (or one of its devices) is not sampled."""
        return {s.name: s.status() for s in self.sources}

    def sample_now(self) -> Snapshot:
        """Take one off-schedule sample (tick -1) now, stored and published like the others:
        recorders use it to close a window on an exact sample."""
        self._open_sources()
        return self._tick(-1)

    # --- the thread ------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._open_sources()
        finally:
            self._ready.set()
        self.start_ns = now_ns()
        k = 0
        while not self._stop.is_set():
            if not self._resume.is_set():
                self._resume.wait()
                k = self._next_slot()  # the schedule keeps its phase across a pause
                continue
            delay_ns = self.start_ns + k * self.period_ns - now_ns()
            if delay_ns > 0 and self._stop.wait(delay_ns / 1e9):
                break
            if not self._resume.is_set():
                continue
            self._tick(k)
            self.ticks += 1
            k = self._after(k)

    def _after(self, k: int) -> int:
        """The next slot: k+1, or the first future slot if this tick overran (counted missed)."""
        nxt = max(k + 1, self._next_slot())
        self.missed_ticks += nxt - (k + 1)
        return nxt

    def _next_slot(self) -> int:
        return (now_ns() - self.start_ns) // self.period_ns + 1

    def _tick(self, k: int) -> Snapshot:
        with self._tick_lock:
            t0 = now_ns()
            values: dict[str, float] = {}
            for source in self.sources:
                values.update(self._sample(source))
            # read-only: every subscriber gets the same mapping
            snap = Snapshot(t_ns=t0, tick=k, values=MappingProxyType(values), sample_ns=now_ns() - t0)
            self.history.append(t0, values)
            self.latest = snap
        self._publish(snap)
        return snap

    def _sample(self, source: Source) -> dict[str, float]:
        try:
            return source.sample()
        except Exception as e:  # sources should not raise; if one does, it must not kill the thread
            _once(
                ("sample", source.name, type(e).__name__),
                logging.ERROR,
                "telemetry source %s failed: %r",
                source.name,
                e,
            )
            return {}

    def _publish(self, snap: Snapshot) -> None:
        with self._lock:
            subscribers = list(self._subscribers)
        for callback in subscribers:
            try:
                callback(snap)
            except Exception:  # a subscriber must never stop sampling
                if id(callback) not in self._failed_subscribers:  # with its traceback, once
                    self._failed_subscribers.add(id(callback))
                    log.exception("telemetry subscriber %r failed (logged once)", callback)

    def _open_sources(self) -> None:
        with self._tick_lock:
            if self._opened:
                return
            self._opened = True
            for source in self.sources:
                if not source.open():
                    log.info("telemetry source %s: %s", source.name, source.reason)
            names = [n for s in self.sources for n in s.units]
            self.history = History(self.history.capacity, names)

    def _close_sources(self) -> None:
        with self._tick_lock:
            for source in self.sources:
                try:
                    source.close()
                except Exception as e:
                    log.warning("telemetry source %s failed to close: %r", source.name, e)
