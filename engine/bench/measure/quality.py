"""Run quality: what other processes did to the machine while each sample was taken.

Every repetition gets the CPU cores other processes kept busy meanwhile (/proc/stat less this
process's own jiffies: engine.cpuload.OtherLoad) and, on an NVIDIA GPU, how many other processes
held it (NVML compute processes other than ours). The kernel counts CPU time in jiffies (10 ms at
100 Hz): one jiffy over a 1 ms repetition would read as 10 busy cores, so the load is read over
windows of consecutive repetitions at least ``MIN_WINDOW_S`` long (one jiffy is then at most
0.1 core) and every repetition of a window gets the window's mean.

A sample whose foreign load reaches the threshold is *disturbed*; the runner re-runs it within a
budget and keeps the clean ones where there are enough. A point's (metric's) quality is then
``disturbed`` (foreign load in a kept sample), ``noisy`` (no foreign load, but IQR/median above
engine.bench.stats' threshold) or ``ok``; a run's is the worst of its metrics'.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opscope.engine.bench.measure.stats import NOISE_THRESHOLD_PCT, summarize

log = logging.getLogger(__name__)

PROC = Path("/proc")  # where other processes' CPU load is read; OPSCOPE_PROC overrides it (tests)
DISTURBED_CORES = 0.25  # default: a sample taken while others kept this many cores busy is disturbed
MIN_WINDOW_S = 0.1  # shortest span the CPU load is read over (see the module docstring)

OK, NOISY, DISTURBED = "ok", "noisy", "disturbed"
QUALITIES = (OK, NOISY, DISTURBED)  # best to worst
LEGEND = (
    f"quality: {OK} = no foreign load, steady; {NOISY} = IQR/median > {NOISE_THRESHOLD_PCT:g}% with no "
    f"foreign load; {DISTURBED} = other processes held the CPU (>= the threshold in cores) or the GPU "
    f"during kept samples"
)


def proc_root() -> Path:
    """The /proc the load is read from: ``$OPSCOPE_PROC`` (a test's fake one) or /proc."""
    return Path(os.environ.get("OPSCOPE_PROC") or PROC)


def worst(qualities: Iterable[str | None]) -> str | None:
    """The worst of ``qualities`` (None entries ignored); None when there is none."""
    known = [q for q in qualities if q in QUALITIES]
    return max(known, key=QUALITIES.index) if known else None


@dataclass(frozen=True)
class SampleLoad:
    """Foreign load while one sample was taken; None where it cannot be read here."""

    other_cores: float | None
    other_gpu_procs: int | None = None

    def disturbed(self, threshold_cores: float) -> bool:
        return (self.other_cores is not None and self.other_cores >= threshold_cores) or bool(self.other_gpu_procs)


class GpuOthers:
    """How many compute processes other than ours hold one NVIDIA GPU (engine.telemetry.nvml's
    wrapper: never raises, None where NVML cannot say)."""

    def __init__(self, index: int = 0, nvml: Any = None, pid: int | None = None):
        from opscope.engine.telemetry.nvml import Nvml

        self.index, self.pid = index, os.getpid() if pid is None else pid
        self.nvml = nvml or Nvml()
        self._handle: Any = None

    def count(self) -> int | None:
        from opscope.engine.telemetry.base import _NotAvailable

        if not self.nvml.init():
            return None
        if self._handle is None:
            self._handle = self.nvml.query("nvmlDeviceGetHandleByIndex", self.index)
        procs = self.nvml.query("nvmlDeviceGetComputeRunningProcesses", self._handle)
        if isinstance(self._handle, _NotAvailable) or isinstance(procs, _NotAvailable):
            return None
        pids = [p.pid for p in procs]
        if self.pid in pids:
            return sum(1 for p in pids if p != self.pid)
        # In a container NVML reports host pids: ours is then one of them if we hold a context.
        return max(0, len(pids) - 1) if _we_hold_cuda() else len(pids)


def _we_hold_cuda() -> bool:
    import sys

    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_initialized())


def gpu_probe(device: str) -> GpuOthers | None:
    """A GpuOthers for a CUDA device string ("cuda", "cuda:1"), else None."""
    if not device.startswith("cuda"):
        return None
    _, _, index = device.partition(":")
    return GpuOthers(int(index) if index.isdigit() else 0)


class LoadProbe:
    """Foreign load per repetition of one point, read over windows of at least ``min_window_s``.

    Made before the point's warm-up; ``start()`` when the timed repetitions begin; ``rep_done()``
    after each one closes the open window once it is long enough; ``close()`` ends the open window:
    one shorter than ``min_window_s`` is read from the latest earlier reading at least that old (the
    warm-up, or the window before), and a point whose whole run is shorter waits out the rest of one
    window first, so a point of a few milliseconds still gets a load that a single jiffy cannot
    dominate. ``loads[i]`` is repetition i's load, None while its
    window is open."""

    def __init__(
        self,
        proc: Path | None = None,
        gpu: GpuOthers | None = None,
        min_window_s: float = MIN_WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ):
        from opscope.engine.core.cpuload import OtherLoad

        self.cpu = OtherLoad(proc_root() if proc is None else proc, clock)
        self.gpu, self.min_window_s, self.clock, self.sleep = gpu, min_window_s, clock, sleep
        self.loads: list[SampleLoad | None] = []
        self._history: list[tuple[float, Any]] = []  # (time, reading), oldest first
        self.start()

    def start(self) -> None:
        self._history.append((self.clock(), self.cpu.reading()))

    @property
    def pending(self) -> bool:
        return bool(self.loads) and self.loads[-1] is None

    def rep_done(self) -> None:
        self.loads.append(None)
        if self.clock() - self._history[-1][0] >= self.min_window_s:
            self._close_window(self._history[-1][1])

    def close(self) -> None:
        if not self.pending:
            return
        now = self.clock()
        if now - self._history[0][0] < self.min_window_s:
            # The whole point took less than one window (a quick matmul: ~30 ms): a reading over it
            # is a few jiffies, read as 0 or as more cores than the machine has (both seen: 0.00 and
            # 2.50 of 2 with one core busy). Let the window grow to its length around the samples.
            self.sleep(self.min_window_s - (now - self._history[0][0]))
            now = self.clock()
        old_enough = [r for t, r in self._history if now - t >= self.min_window_s]
        self._close_window(old_enough[-1] if old_enough else self._history[0][1])

    def _close_window(self, since: Any) -> None:
        now = self.cpu.reading()
        self._history.append((self.clock(), now))
        load = SampleLoad(self.cpu.between(since, now), self.gpu.count() if self.gpu else None)
        first = self.loads.index(None)
        self.loads[first:] = [load] * (len(self.loads) - first)


def split_disturbed(loads: Sequence[SampleLoad | None], threshold_cores: float) -> list[bool]:
    return [bool(load and load.disturbed(threshold_cores)) for load in loads]


def metric_quality(samples: Sequence[float], loads: Sequence[SampleLoad | None], threshold_cores: float) -> str:
    """One metric's quality from its kept samples and their loads."""
    if any(split_disturbed(loads, threshold_cores)):
        return DISTURBED
    return NOISY if summarize(samples).noisy else OK


def load_record(
    loads: Sequence[SampleLoad | None],
    threshold_cores: float,
    dropped: Sequence[float],
    dropped_loads: Sequence[SampleLoad | None],
) -> dict[str, Any]:
    """What a metric stores about foreign load: per kept sample, and the disturbed samples it re-ran."""
    every = list(loads) + list(dropped_loads)
    record: dict[str, Any] = {
        "threshold_cores": threshold_cores,
        "other_cores": [load.other_cores if load else None for load in loads],
        "reps": len(every),
        "disturbed_reps": sum(split_disturbed(every, threshold_cores)),
        "rerun": len(dropped),
    }
    if any(load and load.other_gpu_procs is not None for load in list(loads) + list(dropped_loads)):
        record["other_gpu_procs"] = [load.other_gpu_procs if load else None for load in loads]
    if dropped:
        record["dropped"] = list(dropped)
        record["dropped_other_cores"] = [load.other_cores if load else None for load in dropped_loads]
    return record


def max_other_cores(metrics: Iterable[Any]) -> float | None:
    """The most cores other processes held during any kept sample of ``metrics``; None if unknown."""
    values = [c for m in metrics for c in ((getattr(m, "load", None) or {}).get("other_cores") or []) if c is not None]
    return max(values) if values else None


def run_summary(metrics: Sequence[Any], quality: str | None) -> str:
    """The line the CLI prints under a run's table, e.g. "run quality: disturbed (...)"."""
    if quality is None:
        return "run quality: unknown (no metric with samples)"
    loads = [m.load for m in metrics if getattr(m, "load", None)]
    # a point's metrics (primary, extras, derived) share one record: count each point once
    points = list({json.dumps(load, sort_keys=True, default=str): load for load in loads}.values())
    rerun = sum(load.get("rerun", 0) for load in points)
    disturbed = sum(load.get("disturbed_reps", 0) for load in points)
    top = max_other_cores(metrics)
    threshold = loads[0]["threshold_cores"] if loads else DISTURBED_CORES
    parts = [
        f"other processes kept up to {top:.2f} cores busy during kept samples (threshold {threshold:g})"
        if top is not None
        else "foreign CPU load not readable here"
    ]
    if any(any(load.get("other_gpu_procs") or []) for load in loads):
        parts.append("other processes used the GPU")
    if disturbed:
        # a point drops its disturbed samples only when enough quiet ones replace them, else keeps all
        fate = ([f"{rerun} replaced by quiet re-runs and dropped"] if rerun else []) + (
            [f"{disturbed - rerun} kept: too few quiet repetitions within the re-run budget"]
            if disturbed > rerun
            else []
        )
        parts.append(
            f"{disturbed} of {sum(load.get('reps', 0) for load in points)} samples disturbed, {' and '.join(fate)}"
        )
    return f"run quality: {quality} ({'; '.join(parts)})"
