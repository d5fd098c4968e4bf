"""The benchmark runner: turns benchmark points into raw per-repetition samples, honestly.

Rules: warm-up calls are never recorded; the device is
synchronized before every clock read (CUDA/MPS/XPU synchronize, ``mx.eval`` for MLX, nothing on
CPU); repetitions continue until BOTH ``min_reps`` and ``min_time_s`` are met (or ``max_reps``
caps a very fast point); every sample is kept. A point that fails (out of memory, an unsupported
kernel, an invalid result) is recorded as a failed Metric with its reason and the run goes on;
only cancellation (``Cancelled``, ``KeyboardInterrupt``) stops it.
"""

from __future__ import annotations

import gc
import logging
import math
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opscope.engine.bench.measure import quality as Q
from opscope.engine.bench.measure.devsync import synchronizer
from opscope.engine.bench.measure.memory import peak_tracker
from opscope.engine.bench.measure.quality import DISTURBED_CORES, LoadProbe
from opscope.engine.core import markers
from opscope.engine.core.clock import now_ns
from opscope.engine.core.errors import Cancelled, ConfigError
from opscope.engine.core.results import Metric

log = logging.getLogger(__name__)

Step = Callable[[], Any]
# (done, total, eta_s): done counts points, fractional while one is running; eta_s None until known.
ProgressFn = Callable[[float, int, "float | None"], None]


@dataclass(frozen=True)
class RunnerConfig:
    warmup: int = 2  # calls before the first timed one; never recorded
    min_reps: int = 10
    min_time_s: float = 1.0
    max_reps: int = 10_000  # caps µs-sized points, which would otherwise reach min_time_s slowly
    min_rep_s: float = 1e-3  # points that allow it repeat the call inside one timed rep up to this
    # A repetition taken while other processes kept this many CPU cores busy (or held the GPU) is
    # disturbed and re-run (engine.bench.quality) while either budget lasts: rerun_factor times the
    # clean repetitions (at least min_reps; 1.0: up to 2x the repetitions), or rerun_s seconds.
    disturbed_cores: float = DISTURBED_CORES
    rerun_factor: float = 1.0
    rerun_s: float = 1.0
    # --quick: the whole run's wall time (engine.bench.measure.runner.Budget); None: no budget
    budget_s: float | None = None

    def __post_init__(self):
        if self.warmup < 0 or self.min_reps < 1 or self.max_reps < self.min_reps or self.min_time_s < 0:
            raise ConfigError(
                f"impossible runner settings: {self}; need warmup >= 0, 1 <= min_reps <= max_reps, min_time_s >= 0"
            )
        if self.disturbed_cores <= 0 or self.rerun_factor < 0 or self.rerun_s < 0:
            raise ConfigError(
                f"impossible re-run settings: {self}; need disturbed_cores > 0, rerun_factor >= 0, rerun_s >= 0"
            )


# Repetitions decide what a comparison can show: with n samples per side the exact Mann-Whitney
# test cannot go below p = 2 / C(2n, n) (3: 0.1, never significant at 0.05; 5: 0.0079, and a clear
# 2x change stays significant with two of the 25 pairs out of order). 10 for full runs.
QUICK_MIN_REPS = 5
QUICK_BUDGET_S = 60.0  # "under a minute": kept by the runner, not hoped for from small sizes
QUICK = RunnerConfig(warmup=1, min_reps=QUICK_MIN_REPS, min_time_s=0.05, max_reps=200, budget_s=QUICK_BUDGET_S)


class Budget:
    """A run's time budget (--quick), kept by the runner: each point may repeat for its share of the
    time left (what is left over the points left); past it, the point stops adding repetitions as
    soon as it has one clean one, and is counted as cut short. Loading and warm-up calls are not cut:
    a point is measured at least once."""

    def __init__(self, seconds: float, total_points: int):
        self.seconds, self.total_points = seconds, max(1, total_points)
        self.start_ns = now_ns()
        self.started = 0
        self.cut: list[tuple[str, int]] = []  # (point, repetitions kept) of points stopped short

    @classmethod
    def for_run(cls, cfg: RunnerConfig, total_points: int) -> Budget | None:
        return cls(cfg.budget_s, total_points) if cfg.budget_s is not None else None

    def point_deadline_ns(self) -> int:
        """When the point starting now has used its share (it is counted as started)."""
        left_ns = max(0.0, self.seconds * 1e9 - (now_ns() - self.start_ns))
        share = left_ns / max(1, self.total_points - self.started)
        self.started += 1
        return now_ns() + int(share)

    def record(self) -> dict[str, Any]:
        """What settings keep of the budget: its size, the time taken, the points cut short."""
        return {
            "budget_s": self.seconds,
            "spent_s": round((now_ns() - self.start_ns) / 1e9, 3),
            "points_cut": len(self.cut),
            "points": self.total_points,
            "fewest_reps": min((n for _, n in self.cut), default=None),
        }


def budget_line(record: dict[str, Any] | None, min_reps: int) -> str | None:
    """The run's one line about its budget, when it cut points short (None otherwise)."""
    if not record or not record.get("points_cut"):
        return None
    return (
        f"quick: time budget {record['budget_s']:g} s kept (run took {record['spent_s']:.0f} s): "
        f"{record['points_cut']} of {record['points']} points stopped adding repetitions at "
        f"{record['fewest_reps']}+ (full rule: {min_reps}); fewer samples, wider CIs; drop --quick "
        f"for full runs"
    )


@dataclass(frozen=True)
class Extra:
    """A further metric a point reports per repetition through ``Point.observe`` (e.g. a loss)."""

    name: str
    unit: str
    higher_is_better: bool = False


@dataclass(frozen=True)
class Derived:
    """A metric computed from each primary sample, e.g. MFU from tokens/s; ``params`` say which
    peak it was divided by."""

    name: str
    unit: str
    fn: Callable[[float], float]
    params: Mapping[str, Any] = field(default_factory=dict)
    higher_is_better: bool = True
    # A ceiling the values cannot pass (a utilisation: 100). A sample above it fails the metric,
    # its samples kept, with the reason ``over_limit(highest value)`` gives (it may act on it).
    limit: float | None = None
    over_limit: Callable[[float], str] | None = None

    def problem(self, values: Sequence[float]) -> str | None:
        """Why ``values`` cannot be shown, or None."""
        top = max((v for v in values if math.isfinite(v)), default=None)
        if self.limit is None or top is None or top <= self.limit:
            return None
        if self.over_limit is not None:
            return self.over_limit(top)
        return f"invalid: {top:.4g} {self.unit} is above the ceiling of {self.limit:g}"


@dataclass(frozen=True)
class Point:
    """One thing to measure. ``prepare()`` allocates what the point needs and returns the step to
    time; ``value(seconds_per_call)`` turns a timing into the primary sample (tok/s, GFLOP/s, ms)."""

    name: str
    unit: str
    prepare: Callable[[], Step]
    value: Callable[[float], float]
    params: Mapping[str, Any] = field(default_factory=dict)
    higher_is_better: bool = True
    device: str = "cpu"
    # Called outside the timed region on the step's return value: {extra name: value or values}.
    observe: Callable[[Any], Mapping[str, float | Sequence[float]]] | None = None
    extras: tuple[Extra, ...] = ()
    derived: tuple[Derived, ...] = ()
    # Checks the whole point's extras after the last rep; a returned string fails the point (and
    # the run: a result that is not valid must not pass as a fast one).
    check: Callable[[Mapping[str, list[float]]], str | None] | None = None
    max_inner: int = 1  # >1: a stateless step may be repeated inside one timed rep
    track_memory: bool = False  # record "<name>.peak_mem_bytes" (bytes) per rep


@dataclass(frozen=True)
class PointOutcome:
    point: Point
    metrics: list[Metric]
    error: str | None = None
    invalid: bool = False  # the point ran but its result failed the point's check

    @property
    def ok(self) -> bool:
        return self.error is None


class PointSkipped(Exception):
    """Raised by a point's prepare() when it cannot run here (too big for memory or the time
    budget); recorded as a failed point whose error starts with "skipped:"."""


def skipped_point(
    name: str, unit: str, reason: str, params: Mapping[str, Any] | None = None, higher_is_better: bool = True
) -> Point:
    def prepare() -> Step:
        raise PointSkipped(reason)

    return Point(name, unit, prepare, value=float, params=dict(params or {}), higher_is_better=higher_is_better)


def check_cancel(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise Cancelled("benchmark cancelled")


def _timed(step: Step, sync: Callable[[Any], None], inner: int) -> tuple[int, Any]:
    """One timed repetition: sync, clock, ``inner`` calls, sync on the last output, clock."""
    sync(None)
    t0 = now_ns()
    for _ in range(inner):
        out = step()
    sync(out)
    return now_ns() - t0, out


def _warm_up(step: Step, sync, point: Point, cfg: RunnerConfig, cancel) -> int:
    """Runs the excluded warm-up calls; the last one's time sizes the inner loop."""
    n_warm = max(cfg.warmup, 1 if point.max_inner > 1 else 0)
    elapsed_ns = 0
    for _ in range(n_warm):
        check_cancel(cancel)
        elapsed_ns, _out = _timed(step, sync, 1)
    if point.max_inner <= 1 or elapsed_ns <= 0:
        return 1
    return max(1, min(point.max_inner, math.ceil(cfg.min_rep_s * 1e9 / elapsed_ns)))


class _Samples:
    """Raw samples of one point as they arrive, one entry per repetition; ``finish`` decides which
    repetitions are kept (the clean ones where there are enough) and each one's foreign load."""

    def __init__(self, point: Point):
        self.point = point
        self.primary: list[float] = []
        self.rep_extras: list[dict[str, list[float]]] = []
        self.peak_mem: list[float | None] = []
        self.rep_s: list[float] = []
        self.kept: list[int] | None = None  # indices of kept repetitions; None: all
        self.loads: list = []
        self.threshold = DISTURBED_CORES

    def add(self, seconds_per_call: float, out: Any, peak_bytes: int | None, rep_s: float = 0.0) -> None:
        self.primary.append(float(self.point.value(seconds_per_call)))
        extras: dict[str, list[float]] = {}
        if self.point.observe is not None:
            for name, v in self.point.observe(out).items():
                vals: Iterable[Any] = v if isinstance(v, (list, tuple)) else [v]
                extras.setdefault(name, []).extend(float(x) for x in vals)
        self.rep_extras.append(extras)
        self.peak_mem.append(None if peak_bytes is None else float(peak_bytes))
        self.rep_s.append(rep_s)

    def finish(self, loads: list, cfg: RunnerConfig) -> None:
        """Keeps the clean repetitions if there are at least ``min_reps`` of them, else all."""
        self.loads, self.threshold = loads, cfg.disturbed_cores
        disturbed = Q.split_disturbed(loads, cfg.disturbed_cores)
        clean = [i for i, d in enumerate(disturbed) if not d]
        self.kept = clean if len(clean) >= cfg.min_reps and len(clean) < len(loads) else None

    def _keep(self) -> list[int]:
        return list(range(len(self.primary))) if self.kept is None else self.kept

    @property
    def extras(self) -> dict[str, list[float]]:
        """Each extra's values over the kept repetitions (declared extras first, even if empty)."""
        out: dict[str, list[float]] = {e.name: [] for e in self.point.extras}
        for i in self._keep():
            for name, vals in self.rep_extras[i].items():
                out.setdefault(name, []).extend(vals)
        return out

    def _load_record(self) -> dict[str, Any] | None:
        if not self.loads:
            return None
        keep = set(self._keep())
        dropped = [i for i in range(len(self.primary)) if i not in keep]
        return Q.load_record(
            [self.loads[i] for i in sorted(keep)],
            self.threshold,
            [self.primary[i] for i in dropped],
            [self.loads[i] for i in dropped],
        )

    def _metric(self, name, unit, vals, hib, params, status, error, record) -> Metric:
        quality = None
        if status == "ok" and record is not None and vals:
            quality = Q.metric_quality(vals, [self.loads[i] for i in self._keep()], self.threshold)
        return Metric(name, unit, vals, hib, params, status, error, quality, record)

    def metrics(self, status: str = "ok", error: str | None = None) -> list[Metric]:
        p, keep, record = self.point, self._keep(), self._load_record()
        params = dict(p.params)
        primary = [self.primary[i] for i in keep]
        out = [self._metric(p.name, p.unit, primary, p.higher_is_better, params, status, error, record)]
        units = {e.name: e for e in p.extras}
        for name, vals in self.extras.items():
            e = units.get(name, Extra(name, ""))
            # extras may hold several values per repetition: their quality follows the point's loads
            out.append(self._metric(name, e.unit, vals, e.higher_is_better, params, status, error, record))
        peaks = [self.peak_mem[i] for i in keep if self.peak_mem[i] is not None]
        if peaks:
            out.append(self._metric(f"{p.name}.peak_mem_bytes", "bytes", peaks, False, params, status, error, record))
        for d in p.derived:
            vals = [float(d.fn(v)) for v in primary]
            problem = d.problem(vals) if status == "ok" else None
            out.append(
                self._metric(
                    d.name,
                    d.unit,
                    vals,
                    d.higher_is_better,
                    {**params, **d.params},
                    "failed" if problem else status,
                    problem or error,
                    record,
                )
            )
        return out


def _done(n: int, elapsed_ns: int, cfg: RunnerConfig) -> bool:
    return n >= cfg.max_reps or (n >= cfg.min_reps and elapsed_ns >= cfg.min_time_s * 1e9)


def _fraction(n: int, elapsed_ns: int, cfg: RunnerConfig) -> float:
    """How far a point is towards its stopping rule: both conditions must reach 1."""
    if _done(n, elapsed_ns, cfg):
        return 1.0
    by_time = elapsed_ns / (cfg.min_time_s * 1e9) if cfg.min_time_s > 0 else 1.0
    return min(1.0, n / cfg.min_reps, by_time)


def _rerun_over(samples: _Samples, disturbed: list[bool], cfg: RunnerConfig) -> bool:
    """Whether the re-run budget for disturbed repetitions is spent."""
    n_dist = sum(disturbed)
    if not n_dist:
        return False
    dist_s = sum(t for t, d in zip(samples.rep_s, disturbed) if d)
    clean = len(disturbed) - n_dist
    return n_dist > cfg.rerun_factor * max(cfg.min_reps, clean) and dist_s > cfg.rerun_s


def _stop(samples: _Samples, probe: LoadProbe, cfg: RunnerConfig, elapsed_ns: int) -> bool:
    """The stopping rule over clean repetitions (those in a load window still open count as clean),
    within the re-run budget."""
    disturbed = Q.split_disturbed(probe.loads, cfg.disturbed_cores)
    if _rerun_over(samples, disturbed, cfg) or len(disturbed) >= cfg.max_reps * (1 + cfg.rerun_factor):
        return True
    return _done(len(disturbed) - sum(disturbed), elapsed_ns, cfg)


class _Timer:
    """Times one point's repetitions into its _Samples: markers around each, peak memory, load."""

    def __init__(self, step: Step, point: Point, inner: int, probe: LoadProbe, **marker_fields):
        self.step, self.point, self.inner, self.probe = step, point, inner, probe
        self.sync = synchronizer(point.device)
        self.tracker = peak_tracker(point.device) if point.track_memory else None
        self.samples = _Samples(point)
        self.marker_fields = marker_fields

    def rep(self) -> None:
        rep = len(self.samples.primary)
        if self.tracker is not None:
            self.tracker.reset()
        markers.emit(markers.BENCH_ITER, "start", point=self.point.name, rep=rep, **self.marker_fields)
        elapsed_ns, out = _timed(self.step, self.sync, self.inner)
        markers.emit(markers.BENCH_ITER, "end", point=self.point.name, rep=rep, **self.marker_fields)
        peak = self.tracker.peak_bytes() if self.tracker is not None else None
        self.samples.add(elapsed_ns / 1e9 / self.inner, out, peak, elapsed_ns / 1e9)
        del out  # the next rep's peak memory must not include this rep's output
        self.probe.rep_done()

    def stop(self, cfg: RunnerConfig, elapsed_ns: int, deadline_ns: int | None = None) -> bool:
        """The stopping rule; past ``deadline_ns`` (a budget's share) one clean repetition is enough."""
        if _stop(self.samples, self.probe, cfg, elapsed_ns):
            return True
        if deadline_ns is None or now_ns() < deadline_ns:
            return False
        flags = Q.split_disturbed(self.probe.loads, cfg.disturbed_cores)
        self.cut_short = len(flags) - sum(flags) >= 1
        return self.cut_short

    cut_short = False  # stopped by the budget before the stopping rule held


def _repeat(
    step: Step,
    point: Point,
    cfg: RunnerConfig,
    inner: int,
    cancel,
    tick: Callable[[float], None],
    probe: LoadProbe,
    budget: Budget | None = None,
) -> _Samples:
    timer = _Timer(step, point, inner, probe)
    probe.start()
    start_ns = now_ns()
    deadline = budget.point_deadline_ns() if budget is not None else None
    while True:
        if timer.stop(cfg, now_ns() - start_ns, deadline):
            if not probe.pending:
                break
            probe.close()  # the last window's load may make it re-run some repetitions
            continue
        check_cancel(cancel)
        timer.rep()
        # below 1 until the point is done: re-runs and the last load window may still follow
        tick(min(0.99, _fraction(len(timer.samples.primary), now_ns() - start_ns, cfg)))
    timer.samples.finish(probe.loads, cfg)
    _note_cut(budget, [timer])
    return timer.samples


def _note_cut(budget: Budget | None, timers: list[_Timer]) -> None:
    if budget is not None and any(t.cut_short for t in timers):
        budget.cut.append((timers[0].point.name, min(len(t.samples._keep()) for t in timers)))


def describe_error(e: BaseException) -> str:
    """One line saying why a point failed; out-of-memory errors say so first."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if isinstance(e, PointSkipped):
        return f"skipped: {text}"
    oom = isinstance(e, MemoryError) or "out of memory" in text.lower() or type(e).__name__ == "OutOfMemoryError"
    prefix = "out of memory" if oom else type(e).__name__
    return f"{prefix}: {text[:300]}"


def _free_device_memory(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()


def measure_point(
    point: Point,
    cfg: RunnerConfig,
    cancel: threading.Event | None = None,
    tick: Callable[[float], None] = lambda f: None,
    budget: Budget | None = None,
) -> PointOutcome:
    """Measures one point; failures become a failed outcome, cancellation propagates."""
    step = None
    try:
        probe = LoadProbe(gpu=Q.gpu_probe(point.device))
        step = point.prepare()
        inner = _warm_up(step, synchronizer(point.device), point, cfg, cancel)
        samples = _repeat(step, point, cfg, inner, cancel, tick, probe, budget)
    except (Cancelled, KeyboardInterrupt):
        raise
    except Exception as e:  # a failed point is data, not a crash: record it and go on
        log.warning("benchmark point %s failed: %s", point.name, e, exc_info=log.isEnabledFor(logging.DEBUG))
        error = describe_error(e)
        return PointOutcome(point, _Samples(point).metrics("failed", error)[:1], error)
    finally:
        del step
        _free_device_memory(point.device)
    return _outcome(point, samples)


# --- two settings of one point, interleaved ------------------------------------------------------
# Two runs taken one after the other differ by whatever the machine did in between (clock, thermal
# and cache state, other processes): 10-30 % between consecutive runs on a shared host, more than
# the change being measured. Timing both settings' repetitions alternately in one loop puts that
# drift into both sides alike; the order within a round alternates (A B, B A, ...), so a drift that
# is linear over the loop weighs both sides equally and neither always runs first.
AB_LABELS = ("a", "b")


def interleaved_order(rounds: int) -> list[int]:
    """The side (0: A, 1: B) timed by each repetition of ``rounds`` rounds: ABBA ABBA ..."""
    return [side for r in range(rounds) for side in ((0, 1) if r % 2 == 0 else (1, 0))]


def _prepared(point: Point, cfg: RunnerConfig, cancel, before) -> tuple[Step, int]:
    if before is not None:
        before()
    step = point.prepare()
    return step, _warm_up(step, synchronizer(point.device), point, cfg, cancel)


def _alternate(
    timers: list[_Timer], cfg: RunnerConfig, cancel, tick, before, running: list[int], deadline: int | None = None
) -> None:
    """Rounds of one repetition per side (ABBA order) until both sides' stopping rules hold (or a
    budget's ``deadline`` passed with a clean repetition on each side); both sides get the same
    number of repetitions. ``running[0]`` is the side being timed."""
    rnd = 0
    for t in timers:
        t.probe.start()
    while True:
        spent = [int(sum(t.samples.rep_s) * 1e9) for t in timers]
        if all([t.stop(cfg, ns, deadline) for t, ns in zip(timers, spent)]):
            pending = [t.probe for t in timers if t.probe.pending]
            if not pending:
                return
            for probe in pending:
                probe.close()
            continue
        for side in interleaved_order(rnd + 1)[-2:]:
            check_cancel(cancel)
            running[0] = side
            if before[side] is not None:
                before[side]()
            timers[side].rep()
        rnd += 1
        tick(min(0.99, *(_fraction(len(t.samples.primary), ns, cfg) for t, ns in zip(timers, spent))))


def measure_pair(
    pair: tuple[Point, Point],
    cfg: RunnerConfig,
    cancel: threading.Event | None = None,
    tick: Callable[[float], None] = lambda f: None,
    before: tuple[Callable[[], None] | None, Callable[[], None] | None] = (None, None),
    budget: Budget | None = None,
) -> tuple[PointOutcome, PointOutcome]:
    """Measures point A and point B (the same point under two settings) with their repetitions
    interleaved, ABBA. ``before[i]`` runs before each of side i's calls outside the clock (e.g. it
    sets the side's thread count). A side that cannot be prepared fails alone and the other is
    measured by itself; a side whose step fails mid-way fails, and the other is measured again alone."""
    timers: list[_Timer] = []
    running = [0]
    try:
        probes = [LoadProbe(gpu=Q.gpu_probe(point.device)) for point in pair]  # the warm-ups' load too
        for side, point in enumerate(pair):
            running[0] = side
            step, inner = _prepared(point, cfg, cancel, before[side])
            timers.append(_Timer(step, point, inner, probes[side], ab=AB_LABELS[side]))
        # the same calls per timed repetition on both sides: the loop shape must not differ
        for t in timers:
            t.inner = min(x.inner for x in timers)
        _alternate(
            timers, cfg, cancel, tick, before, running, budget.point_deadline_ns() if budget is not None else None
        )
    except (Cancelled, KeyboardInterrupt):
        raise
    except Exception as e:  # the failing side is data; the other is measured alone
        del timers  # free both sides' buffers before the other side is measured again
        return _one_side_failed(pair, running[0], e, cfg, cancel, tick, budget)
    finally:
        for point in pair:
            _free_device_memory(point.device)
    _finish_jointly(timers, cfg)
    _note_cut(budget, timers)
    return tuple(_outcome(t.point, t.samples) for t in timers)  # type: ignore[return-value]


def _finish_jointly(timers: list[_Timer], cfg: RunnerConfig) -> None:
    """Keeps the same rounds on both sides: those where neither side's repetition was disturbed,
    if there are at least ``min_reps`` of them, else every round (A's rep i and B's rep i share a
    round). Dropping a disturbed rep on one side only would compare clean A with loaded B."""
    for t in timers:
        t.samples.finish(t.probe.loads, cfg)
    flags = [Q.split_disturbed(t.probe.loads, cfg.disturbed_cores) for t in timers]
    clean = [i for i, pair in enumerate(zip(*flags)) if not any(pair)]
    kept = clean if cfg.min_reps <= len(clean) < len(flags[0]) else None
    for t in timers:
        t.samples.kept = kept


def _one_side_failed(
    pair, failed: int, e: Exception, cfg, cancel, tick, budget: Budget | None = None
) -> tuple[PointOutcome, PointOutcome]:
    log.warning("benchmark point %s (%s) failed: %s", pair[failed].name, AB_LABELS[failed], e)
    error = describe_error(e)
    out = [PointOutcome(pair[failed], _Samples(pair[failed]).metrics("failed", error)[:1], error)] * 2
    other = 1 - failed
    out[other] = measure_point(pair[other], cfg, cancel, tick, budget)
    return out[0], out[1]


def _outcome(point: Point, samples: _Samples) -> PointOutcome:
    problem = point.check(samples.extras) if point.check is not None else None
    if problem:
        return PointOutcome(point, samples.metrics("failed", problem), problem, invalid=True)
    return PointOutcome(point, samples.metrics())


def run_points(
    points: Iterable[Point],
    cfg: RunnerConfig,
    *,
    cancel: threading.Event | None = None,
    progress: ProgressFn | None = None,
    total: int | None = None,
    budget: Budget | None = None,
) -> Iterator[PointOutcome]:
    """Measures each point in turn, yielding its outcome as soon as it is known (so a store can
    commit it at once). ``total`` is the number of points when ``points`` is a generator.
    ``budget``: the run's time budget (Budget.for_run), shared by its points."""
    if total is None:
        listed = list(points)
        points, total = listed, len(listed)
    start_ns = now_ns()

    def report(done: float) -> None:
        if progress is None:
            return
        elapsed_s = (now_ns() - start_ns) / 1e9
        eta = elapsed_s / done * (total - done) if done > 0 else None
        progress(done, total, eta)

    def tick(i: int) -> Callable[[float], None]:  # point i's fraction done → the run's progress
        return lambda f: report(i + f)

    report(0.0)
    for i, point in enumerate(points):
        check_cancel(cancel)
        outcome = measure_point(point, cfg, cancel, tick=tick(i), budget=budget)
        report(float(i + 1))
        yield outcome
