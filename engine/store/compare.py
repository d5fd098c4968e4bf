"""Compare two or more saved runs, benchstat-style.

For every metric (matched across runs by name, unit and point parameters): each run's median with
its 95% CI, the change of each later run against the first (the baseline) in percent of the
baseline's median, and the two-sided Mann-Whitney U p-value of the raw samples. A change with
p > alpha is reported as "~" (no significant difference) whatever its size, and only where the
sample counts could have reached alpha at all: 3 vs 3 samples can never give p < 0.1, so such a
row says "n too small to decide" instead of "~" (``Delta.decidable``). Metrics are grouped in
one section per unit, each with a geometric-mean row (over metrics present in every run), as
benchstat does: a geomean across units (tok/s with ms) would mix better-is-higher with
better-is-lower and mean nothing.

Rendering lives in engine.store.render.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from opscope.engine.bench.ceilings.utilisation import PEAK_PARAMS, over_ceiling
from opscope.engine.bench.measure.memory import SHARED_AB
from opscope.engine.bench.measure.quality import DISTURBED
from opscope.engine.bench.measure.stats import (
    DEFAULT_CONFIDENCE,
    Summary,
    can_reach,
    geomean,
    mann_whitney_p,
    min_p_value,
    min_samples_per_side,
    summarize,
)
from opscope.engine.core.errors import ConfigError
from opscope.engine.core.results import Metric
from opscope.engine.store.convert import RunInfo, StoredRun

DEFAULT_ALPHA = 0.05
MIN_SAMPLES = 10  # below this a cell is flagged: its CI is wide and small changes cannot be significant


@dataclass(frozen=True, slots=True)
class Cell:
    status: str  # "ok" | "failed" | "missing"
    summary: Summary | None = None
    error: str | None = None
    quality: str | None = None  # engine.bench.quality: "ok" | "noisy" | "disturbed"; None: unknown

    @property
    def disturbed(self) -> bool:
        return self.quality == DISTURBED

    @property
    def few_samples(self) -> bool:
        return self.summary is not None and self.summary.n < MIN_SAMPLES

    @property
    def noisy(self) -> bool:
        return self.summary is not None and self.summary.noisy

    @property
    def usable(self) -> bool:
        return self.status == "ok" and self.summary is not None and self.summary.n > 0

    @property
    def median(self) -> float:
        """The summary's median; NaN for a cell without samples."""
        return self.summary.median if self.summary is not None else float("nan")


@dataclass(frozen=True, slots=True)
class Delta:
    delta_pct: float  # (median / baseline median - 1) * 100
    p_value: float
    significant: bool  # p <= alpha (and the sample counts can reach alpha)
    n_base: int
    n_other: int
    worse: bool  # in the direction the metric counts as worse (lower when higher_is_better)
    decidable: bool = True  # False: n_base vs n_other samples cannot reach alpha, whatever the data
    min_p: float = 0.0  # the smallest p these sample counts allow (2 / C(n+m, n))
    need_per_side: int = 0  # the fewest samples per side that can reach alpha


@dataclass(frozen=True, slots=True)
class Row:
    name: str
    unit: str
    params: dict[str, Any]
    higher_is_better: bool
    cells: tuple[Cell, ...]  # one per run
    deltas: tuple[Delta | None, ...]  # one per run after the first

    def disturbed_pair(self, i: int) -> list[int]:
        """Which of run 0 and run ``i`` (indices) had foreign load in this metric's samples."""
        return [j for j in (0, i) if self.cells[j].disturbed]

    @property
    def label(self) -> str:
        """The name, the point's parameters, and for a utilisation the peak it divides by."""
        shown = {k: v for k, v in self.params.items() if k not in PEAK_PARAMS}
        label = self.name
        if shown:
            label += f" [{', '.join(f'{k}={v}' for k, v in sorted(shown.items()))}]"
        return label + (f" (of {self.params['peak']})" if self.params.get("peak") else "")


@dataclass(frozen=True, slots=True)
class Section:
    unit: str
    rows: tuple[Row, ...]
    geomeans: tuple[float, ...] | None  # per run, over rows usable in every run; None below 2 rows
    geomean_deltas_pct: tuple[float, ...] | None  # per run after the first


@dataclass(frozen=True, slots=True)
class Regression:
    row: Row
    run_index: int
    delta: Delta


@dataclass(frozen=True, slots=True)
class Comparison:
    runs: tuple[RunInfo, ...]
    sections: tuple[Section, ...]
    differences: tuple[tuple[str, tuple[Any, ...]], ...]  # (field, value per run), differing only
    alpha: float = DEFAULT_ALPHA
    confidence: float = DEFAULT_CONFIDENCE
    notes: tuple[str, ...] = field(default=())
    # "interleaved": the runs' repetitions alternated in one process (`opscope bench --ab`), so the
    # machine's drift fell on both alike; "sequential": taken one after the other (a warning says so)
    measurement: str = "sequential"

    def regressions(self, threshold_pct: float = 0.0) -> list[Regression]:
        """Significant changes for the worse by more than ``threshold_pct`` percent."""
        found = []
        for section in self.sections:
            for row in section.rows:
                for i, d in enumerate(row.deltas, start=1):
                    if d is not None and d.significant and d.worse and abs(d.delta_pct) > threshold_pct:
                        found.append(Regression(row, i, d))
        return found

    def undecided(self, threshold_pct: float = 0.0) -> list[Regression]:
        """Changes for the worse by more than ``threshold_pct`` percent that the sample counts
        cannot test at ``alpha``: neither a regression nor "no change"."""
        found = []
        for section in self.sections:
            for row in section.rows:
                for i, d in enumerate(row.deltas, start=1):
                    if d is not None and not d.decidable and d.worse and abs(d.delta_pct) > threshold_pct:
                        found.append(Regression(row, i, d))
        return found

    @property
    def min_samples_per_side(self) -> int:
        return min_samples_per_side(self.alpha)

    @property
    def has_undecidable(self) -> bool:
        return any(d is not None and not d.decidable for s in self.sections for r in s.rows for d in r.deltas)

    @property
    def has_few_samples(self) -> bool:
        return any(c.few_samples for s in self.sections for r in s.rows for c in r.cells)

    @property
    def has_noisy(self) -> bool:
        return any(c.noisy for s in self.sections for r in s.rows for c in r.cells)

    @property
    def has_disturbed(self) -> bool:
        return any(c.disturbed for s in self.sections for r in s.rows for c in r.cells)


LEGACY_NAMES = {".peak_mem": ".peak_mem_bytes"}  # runs saved before the unit was in the name


def _metric_key(m: Metric) -> tuple[str, str, str]:
    name = m.name
    for old, new in LEGACY_NAMES.items():
        if name.endswith(old):
            name = name[: -len(old)] + new
    # which peak a utilisation divided by is shown, not matched: a re-measured peak must not split
    # a row in two (a differing peak becomes a note instead)
    params = {k: v for k, v in m.params.items() if k not in PEAK_PARAMS}
    return name, m.unit, json.dumps(params, sort_keys=True, default=str)


def _cell(metric: Metric | None, confidence: float) -> Cell:
    if metric is None:
        return Cell("missing")
    if metric.status != "ok":
        return Cell("failed", error=metric.error or "failed")
    problem = over_ceiling(metric)
    if problem:
        return Cell("failed", error=problem)
    summary = summarize(metric.samples, confidence)
    return Cell("ok" if summary.n else "failed", summary, None if summary.n else "no samples", metric.quality)


def _delta(
    base: Cell, other: Cell, base_m: Metric, other_m: Metric, higher_is_better: bool, alpha: float
) -> Delta | None:
    if not (base.usable and other.usable) or base.summary is None or other.summary is None or base.summary.median == 0:
        return None
    pct = (other.summary.median / base.summary.median - 1.0) * 100.0
    p = mann_whitney_p(base_m.samples, other_m.samples)
    worse = pct < 0 if higher_is_better else pct > 0
    n, m = base.summary.n, other.summary.n
    decidable = can_reach(n, m, alpha)
    return Delta(
        pct, p, bool(decidable and p <= alpha), n, m, worse, decidable, min_p_value(n, m), min_samples_per_side(alpha)
    )


def compare_samples(
    base: Sequence[float],
    other: Sequence[float],
    *,
    higher_is_better: bool = False,
    alpha: float = DEFAULT_ALPHA,
    confidence: float = DEFAULT_CONFIDENCE,
) -> tuple[Cell, Cell, Delta | None]:
    """Two raw sample lists under the rules of a compare row (significance, decidability, noise):
    for comparisons that are not of stored metrics (`trace diff`'s step times)."""
    metrics = [Metric("samples", "", list(x), higher_is_better=higher_is_better) for x in (base, other)]
    cells = [_cell(m, confidence) for m in metrics]
    return cells[0], cells[1], _delta(cells[0], cells[1], metrics[0], metrics[1], higher_is_better, alpha)


def _row(key: tuple[str, str, str], metrics: list[Metric | None], alpha: float, confidence: float) -> Row:
    first = next(m for m in metrics if m is not None)
    cells = tuple(_cell(m, confidence) for m in metrics)
    if first.params.get("memory") == SHARED_AB:  # one process's peak for both sides: no change to claim
        return Row(key[0], first.unit, dict(first.params), first.higher_is_better, cells, (None,) * (len(metrics) - 1))
    base = metrics[0]
    deltas = tuple(
        _delta(cells[0], cells[i], base, other, first.higher_is_better, alpha)
        if base is not None and other is not None
        else None
        for i, other in enumerate(metrics[1:], start=1)
    )
    return Row(key[0], first.unit, dict(first.params), first.higher_is_better, cells, deltas)


def _section(unit: str, rows: list[Row]) -> Section:
    complete = [r for r in rows if all(c.usable and c.median > 0 for c in r.cells)]
    if len(complete) < 2:
        return Section(unit, tuple(rows), None, None)
    per_run = tuple(geomean([r.cells[i].median for r in complete]) for i in range(len(rows[0].cells)))
    deltas = tuple((g / per_run[0] - 1.0) * 100.0 for g in per_run[1:])
    return Section(unit, tuple(rows), per_run, deltas)


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    if isinstance(value, dict) and value:
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = json.dumps(value, sort_keys=True, default=str) if isinstance(value, (list, dict)) else value


DERIVED_SETTINGS = (".suite_params.roofline.", ".suite_params.energy", "settings.interleaved.")


def differences(runs: Sequence[StoredRun]) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    """Settings and fingerprint fields whose values are not the same in every run (None = absent)."""
    flat = []
    for run in runs:
        fields: dict[str, Any] = {}
        _flatten("settings", run.result.settings, fields)
        _flatten("fingerprint", run.result.fingerprint, fields)
        flat.append(fields)
    keys = list(dict.fromkeys(k for f in flat for k in f))
    diffs = {k: tuple(f.get(k) for f in flat) for k in keys if len({repr(f.get(k)) for f in flat}) > 1}
    # a fingerprint may embed the settings it was taken with: say each difference once; derived
    # bookkeeping (the roofline's work per token follows from the model and its settings) is no setting
    return tuple(
        (k, v)
        for k, v in diffs.items()
        if not (k.startswith("fingerprint.settings.") and diffs.get(k[len("fingerprint.") :]) == v)
        and not any(part in k for part in DERIVED_SETTINGS)
    )


def _peak_value(m: Metric):
    """The peak a metric divides by: its value when recorded (``peak_value``), else its label."""
    value = m.params.get("peak_value")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return round(float(value), 6)
    return m.params.get("peak")


def _peak_notes(by_key: dict[tuple[str, str, str], list[Metric | None]]) -> list[str]:
    notes = []
    for key, metrics in by_key.items():
        present = [m for m in metrics if m is not None]
        labels = [m.params.get("peak") for m in present]
        if len({_peak_value(m) for m in present}) > 1:  # the numbers, not their labels (dtype named or not)
            notes.append(
                f"{key[0]}: the runs divide by different peaks ({' / '.join(map(str, labels))}): "
                f"its change mixes speed with the denominator"
            )
    return notes


def _run_notes(runs: Sequence[StoredRun]) -> tuple[str, ...]:
    notes = [
        f"run {r.info.name!r} is {r.info.status}"
        + (f" ({r.info.error})" if r.info.error else "")
        + ": its data may be partial"
        for r in runs
        if r.info.status != "completed"
    ]
    disturbed = [r.info.name for r in runs if r.info.quality == DISTURBED]
    if disturbed:
        notes.append(
            f"disturbed: {', '.join(repr(n) for n in disturbed)} ran while other processes held the "
            f"CPU or GPU: a change against {'it' if len(disturbed) == 1 else 'them'} may be the load, "
            f"not the settings; rerun on a quiet machine"
        )
    kinds = sorted({r.info.kind for r in runs})
    if len(kinds) > 1:
        notes.append(f"the runs are of different kinds ({', '.join(kinds)}): only shared metrics compare")
    return tuple(notes)


DRIFT_SEEN_PCT = "10-30 %"  # between two consecutive runs of the same settings on a shared 2-core host


def interleaved_pair(runs: Sequence[StoredRun]) -> bool:
    """Whether ``runs`` are the two runs of one `opscope bench --ab` (engine.bench.ab)."""
    pairs = [((r.result.settings or {}).get("interleaved") or {}).get("pair") for r in runs]
    names = [r.info.name for r in runs]
    first = pairs[0] if runs else None
    return len(runs) == 2 and bool(first) and first == pairs[1] and sorted(first or ()) == sorted(names)


def _drift_note(runs: Sequence[StoredRun]) -> list[str]:
    """For runs taken one after the other: drift between them can exceed the change measured."""
    from opscope.engine.bench.measure.quality import max_other_cores

    if interleaved_pair(runs) or not all(r.result.metrics for r in runs):
        return []
    starts = sorted(r.info.created_at for r in runs)
    gap = (starts[-1] - starts[0]).total_seconds()
    loads = [max_other_cores(r.result.metrics) for r in runs]
    load = ", ".join(f"{r.info.name!r} {'?' if c is None else f'{c:.2f}'}" for r, c in zip(runs, loads))
    return [
        f"sequential: the runs were measured one after the other (started {gap / 60:.1f} min apart), not "
        f"interleaved: the machine's speed drifts between runs ({DRIFT_SEEN_PCT} seen on a shared host) by "
        f"more than a small change, so a change of that size may be drift, and drift may hide one "
        f"(foreign CPU load, most cores busy during kept samples: {load}); measure small changes "
        f"interleaved in one process: opscope bench SUITE ... --ab 'FLAGS'"
    ]


def compare(
    runs: Sequence[StoredRun], *, alpha: float = DEFAULT_ALPHA, confidence: float = DEFAULT_CONFIDENCE
) -> Comparison:
    """Compare ``runs``; the first one is the baseline every change is measured against."""
    if len(runs) < 2:
        raise ConfigError(f"compare needs at least two runs, got {len(runs)}")
    by_key: dict[tuple[str, str, str], list[Metric | None]] = {}
    for i, run in enumerate(runs):
        for m in run.result.metrics:
            by_key.setdefault(_metric_key(m), [None] * len(runs))[i] = m
    sections: dict[str, list[Row]] = {}
    for key, metrics in by_key.items():
        sections.setdefault(key[1], []).append(_row(key, metrics, alpha, confidence))
    return Comparison(
        runs=tuple(r.info for r in runs),
        sections=tuple(_section(unit, rows) for unit, rows in sections.items()),
        differences=differences(runs),
        alpha=alpha,
        confidence=confidence,
        notes=_run_notes(runs) + tuple(_peak_notes(by_key)) + tuple(_drift_note(runs)),
        measurement="interleaved" if interleaved_pair(runs) else "sequential",
    )
