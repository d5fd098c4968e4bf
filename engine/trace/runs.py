"""Traces are runs: a script's trace saved in the run store (kind "trace") with its summary,
per-step times, telemetry and fingerprint, and two saved traces compared (`opscope trace diff A B`).

The summary (RunResult.trace_summary) is plain JSON, so a diff needs nothing but two stored rows.
"""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

from opscope.engine.core.errors import ConfigError
from opscope.engine.core.results import Metric, RunResult
from opscope.engine.core.units import count_rate
from opscope.engine.trace.aggregate import module_pattern
from opscope.engine.trace.events import DIRECTIONS, ON_TARGET

RUN_KIND = "trace"
SUMMARY_VERSION = 1
TOP_MODULES = 12


def summary(trace, report) -> dict[str, Any]:
    """The JSON a saved trace keeps: what `trace diff` and the Runs panel read."""
    steady = max(report.decode_steps, 1)
    per_step = {t.direction: round(t.per_token_count, 3) for t in report.transfers}
    return {
        "version": SUMMARY_VERSION,
        "unit": report.unit,
        "script": trace.spec.label,
        "argv": list(trace.spec.args),
        "target": report.target,
        "step_source": trace.step_source,
        "steps": report.tokens,
        "step_ms": [round(v, 4) for v in trace.step_ms],
        "median_step_ms": round(statistics.median(trace.step_ms), 4) if trace.step_ms else None,
        "wall_ms": round(trace.outcome.wall_ns / 1e6, 3),
        "exit_code": trace.outcome.exit_code,
        "error": trace.outcome.error,
        "ops": report.ops,
        "ops_on_target": report.by_kind.get(ON_TARGET, {}).get("count", 0),
        "ops_off_target": report.ops - report.by_kind.get(ON_TARGET, {}).get("count", 0),
        "ops_per_step": round(_ops_per_step(trace.result, report.tokens), 2),
        "ops_on_target_pct": round(report.ops_on_target_pct, 3),
        "transfers_per_step": {d: per_step.get(d, 0.0) for d in DIRECTIONS},
        "syncs_per_step": round(report.syncs_per_token, 3),
        "syncs": report.syncs,
        "findings": [_finding(f) for f in report.findings],
        "modules": _module_times(trace.result.events, steady),
        "losses": [round(v, 6) for v in trace.losses[:2000]],
        "roots": trace.roots,
    }


def _ops_per_step(result, steps: int) -> float:
    counts = (
        [c.ops for s, c in result.stats.steps.items() if 1 <= s < steps]
        if steps > 1
        else [c.ops for c in result.stats.steps.values()]
    )
    return sum(counts) / max(len(counts), 1)


def _finding(f) -> dict:
    return {
        "kind": f.kind,
        "severity": f.severity,
        "title": f.title,
        "modules": list(f.modules),
        "sources": list(f.sources),
        "fix": f.fix,
    }


def _module_times(events, steady_steps: int) -> dict[str, dict]:
    """Host time and op count per module pattern over the stored events, top ones first."""
    ns: Counter = Counter()
    count: Counter = Counter()
    for ev in events:
        key = module_pattern(ev.module) or "(outside any module)"
        ns[key] += ev.dur_ns
        count[key] += 1
    return {m: {"ms": round(t / 1e6, 3), "ops": count[m]} for m, t in ns.most_common(40)}


def run_result(trace, report, *, name: str = "", settings: dict | None = None, recorder=None) -> RunResult:
    from opscope.engine.core import fingerprint

    settings = dict(settings or {}, script=trace.spec.label, args=list(trace.spec.args), target=report.target)
    run = RunResult(
        kind=RUN_KIND,
        name=name,
        settings=settings,
        fingerprint=fingerprint.collect(settings),
        trace_summary=summary(trace, report),
        status="completed" if trace.outcome.exit_code == 0 else "failed",
        error=(trace.outcome.error or f"exit code {trace.outcome.exit_code}") if trace.outcome.exit_code else None,
    )
    if trace.step_ms:
        run.metrics.append(
            Metric(
                "step_ms",
                "ms",
                list(trace.step_ms),
                higher_is_better=False,
                params={"steps": report.tokens, "step_source": trace.step_source},
            )
        )
    if recorder is not None:
        recorder.attach(run)
    return run


def save(run: RunResult, db: str | None = None) -> tuple[int, str]:
    """Save a trace run; returns (id, name). A missing SQLite store is created, and said so."""
    from opscope.engine.store.access import open_store

    with open_store(db, write=True) as store:
        run_id = store.save(run)
        return run_id, store.info(run_id).name


def load_summaries(refs: list[str], db: str | None = None) -> list[tuple[str, dict]]:
    from opscope.engine.store.access import open_store

    out = []
    with open_store(db) as store:  # reading creates no store
        for ref in refs:
            stored = store.load(ref)
            s = stored.result.trace_summary
            if stored.info.kind != RUN_KIND or not s or "unit" not in s:
                raise ConfigError(
                    f"run {ref} ({stored.info.name}) is a {stored.info.kind} run, not a saved "
                    f"script trace (`opscope runs list --kind trace` lists those)"
                )
            out.append((stored.info.name, s))
    return out


def diff(a: dict, b: dict) -> dict[str, Any]:
    """What changed from trace A to trace B."""
    keys_a = {(f["kind"], tuple(f["sources"]), tuple(f["modules"])): f for f in a["findings"]}
    keys_b = {(f["kind"], tuple(f["sources"]), tuple(f["modules"])): f for f in b["findings"]}
    return {
        "median_step_ms": (a.get("median_step_ms"), b.get("median_step_ms")),
        "step_change": step_change(a.get("step_ms") or [], b.get("step_ms") or []),
        "steps": (a["steps"], b["steps"]),
        "wall_ms": (a["wall_ms"], b["wall_ms"]),
        "ops_per_step": (a["ops_per_step"], b["ops_per_step"]),
        "ops_on_target": (a["ops_on_target"], b["ops_on_target"]),
        "ops_off_target": (a["ops_off_target"], b["ops_off_target"]),
        "transfers_per_step": {
            d: (a["transfers_per_step"].get(d, 0.0), b["transfers_per_step"].get(d, 0.0)) for d in DIRECTIONS
        },
        "syncs_per_step": (a["syncs_per_step"], b["syncs_per_step"]),
        "last_loss": (_last(a.get("losses")), _last(b.get("losses"))),
        "only_in_a": [f for k, f in keys_a.items() if k not in keys_b],
        "only_in_b": [f for k, f in keys_b.items() if k not in keys_a],
        "modules": _module_changes(a["modules"], b["modules"]),
    }


def step_change(a_ms: list[float], b_ms: list[float]) -> dict[str, Any] | None:
    """B's step times against A's under `runs compare`'s rules (engine.store.compare): Mann-Whitney
    significance at its alpha, "n too small to decide" where the step counts cannot reach it, and
    each side's noise (IQR/median) flagged above the same threshold. None without steps on a side."""
    from opscope.engine.store.compare import DEFAULT_ALPHA, compare_samples

    if not a_ms or not b_ms:
        return None
    cell_a, cell_b, delta = compare_samples(a_ms, b_ms, higher_is_better=False)
    if delta is None or cell_a.summary is None or cell_b.summary is None:
        return None
    return {
        "delta_pct": delta.delta_pct,
        "p_value": delta.p_value,
        "significant": delta.significant,
        "decidable": delta.decidable,
        "slower": delta.worse,
        "n": (delta.n_base, delta.n_other),
        "need_per_side": delta.need_per_side,
        "alpha": DEFAULT_ALPHA,
        "noise_pct": (cell_a.summary.noise_pct, cell_b.summary.noise_pct),
        "noisy": (cell_a.noisy, cell_b.noisy),
    }


def step_change_lines(c: dict[str, Any] | None) -> list[str]:
    """The verdict on the median step, in `runs compare`'s words, and a noise warning."""
    if c is None:
        return ["    verdict: — (no step times on one side)"]
    n = f"n={c['n'][0]}+{c['n'][1]}"
    if not c["decidable"]:  # "~" would claim "no change"; these counts could not have shown one
        lines = [
            f"    verdict: {c['delta_pct']:+.2f}%? n too small to decide (need ≥ {c['need_per_side']} "
            f"steps per side, {n})"
        ]
    elif c["significant"]:
        lines = [
            f"    verdict: {c['delta_pct']:+.2f}% (p={c['p_value']:.3f} {n}): B is "
            f"{'slower' if c['slower'] else 'faster'}"
        ]
    else:
        lines = [f"    verdict: ~ (p={c['p_value']:.3f} {n}): no significant difference (p > {c['alpha']:g})"]
    if any(c["noisy"]):
        from opscope.engine.bench.measure.stats import NOISE_THRESHOLD_PCT

        noise = ", ".join(f"{side} {pct:.0f}%" for side, pct in zip("AB", c["noise_pct"], strict=True))
        lines.append(
            f"    noisy: step-time IQR/median {noise} (over {NOISE_THRESHOLD_PCT:g}%): rerun on a "
            f"quieter machine or with more steps"
        )
    return lines


def _last(values: list | None) -> float | None:
    return values[-1] if values else None


def _module_changes(a: dict, b: dict) -> list[dict]:
    rows: dict[str, dict[str, Any]] = {}
    for m in set(a) | set(b):
        x, y = a.get(m, {"ms": 0.0, "ops": 0}), b.get(m, {"ms": 0.0, "ops": 0})
        rows[m] = {"module": m, "ms": (x["ms"], y["ms"]), "ops": (x["ops"], y["ops"])}
    ranked = sorted(rows.values(), key=lambda r: -abs(r["ms"][1] - r["ms"][0]))
    return ranked[:TOP_MODULES]


def render_diff(d: dict, name_a: str, name_b: str) -> str:
    lines = [f"Trace diff: A = {name_a}, B = {name_b}", f"  {'':<28} {'A':>12} {'B':>12} {'B/A':>8}"]

    def row(label, pair, fmt="{:.3g}"):
        x, y = pair
        ratio = f"{y / x:.2f}×" if isinstance(x, (int, float)) and isinstance(y, (int, float)) and x else ""

        def show(v: object) -> str:
            return "—" if v is None else fmt(v) if callable(fmt) else fmt.format(v)

        lines.append(f"  {label:<28} {show(x):>12} {show(y):>12} {ratio:>8}")

    row("median step (ms)", d["median_step_ms"])
    lines += step_change_lines(d.get("step_change"))
    row("steps", d["steps"], "{:d}")
    row("wall time (ms)", d["wall_ms"], "{:.1f}")
    row("ops per step", d["ops_per_step"], "{:.1f}")
    row("ops on target", d["ops_on_target"], "{:,}")
    row("ops off target", d["ops_off_target"], "{:,}")
    for direction, pair in d["transfers_per_step"].items():
        if any(pair):
            row(f"{direction} transfers per step", pair, count_rate)
    row("syncs per step", d["syncs_per_step"], count_rate)
    if any(v is not None for v in d.get("last_loss", ())):
        row("loss at the last step", d["last_loss"], "{:.4g}")
    for label, found in (
        ("Findings only in A (fixed in B)", d["only_in_a"]),
        ("Findings only in B (new)", d["only_in_b"]),
    ):
        lines += ["", f"{label}: {len(found) or 'none'}"]
        lines += [f"  [{f['kind']}] {f['title']}" for f in found]
    lines += ["", "Modules whose host time changed most (ms in A → B, ops in A → B):"]
    for r in d["modules"]:
        lines.append(
            f"  {r['module'][:44]:<44} {r['ms'][0]:>9.2f} → {r['ms'][1]:<9.2f} {r['ops'][0]:>7,} → {r['ops'][1]:,}"
        )
    return "\n".join(lines) + "\n"
