"""From grouped counters to findings a user can act on: what, where (module and source line), how
often per generated token, and a one-line fix.

1. The engine's own I/O is accepted first: outside the model, at most one host→device copy, one
   device→host copy and one sync per step (input id in, sampled id out). Anything beyond is a finding.
2. Storms: at least ``storm_min_count`` tiny transfers/syncs from one module and source line inside
   one step (a per-element Python loop). They absorb the groups they are made of.
3. The remaining off-target groups are merged per module pattern, and patterns with the same
   source lines are merged again, so a bug in one class shows once with every module it touches.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from opscope.engine.core.units import count_rate
from opscope.engine.trace.aggregate import Group, TraceStats
from opscope.engine.trace.classify import DeviceMatcher
from opscope.engine.trace.events import D2H, FALLBACK, H2D, MIXED, SYNC, TRANSFER, TraceOptions
from opscope.engine.trace.modstack import ROOT

STORM = "storm"
_ENGINE_LOOP = "(engine loop, outside the model)"


@dataclass(frozen=True)
class Finding:
    kind: str  # "fallback" | "transfer" | "sync" | "mixed" | "storm"
    severity: str  # "high" | "medium" | "low"
    title: str
    modules: tuple[str, ...]  # module patterns ("layers.*.attn_norm"); "" = outside the model
    sources: tuple[str, ...]  # file:line, first seen first
    evidence: dict = field(default_factory=dict)
    fix: str = ""


def decode_rate(group: Group, tokens: int) -> float:
    """Mean count per decode step (per step over the whole region when there is no decoding)."""
    if tokens > 1:
        return sum(c for s, c in group.steps.items() if 1 <= s < tokens) / (tokens - 1)
    return group.count / max(len(group.steps), 1)


def decode_bytes(group: Group, tokens: int) -> float:
    """Mean bytes moved per decode step (per step over the whole region when there is no decoding)."""
    if tokens > 1:
        return sum(b for s, b in group.step_bytes.items() if 1 <= s < tokens) / (tokens - 1)
    return group.bytes_moved / max(len(group.steps), 1)


@dataclass(frozen=True)
class IoPolicy:
    """What a step may move without a finding: per slot (H2D, D2H, "sync") a name and a count per
    step, from code outside any module in ``scopes``. ``any_size_h2d``: uploads of any size are
    accepted every step (a training loop's batches), not only in step 0 (a prompt)."""

    names: dict
    capacity: dict
    scopes: tuple = ("", ROOT)
    any_size_h2d: bool = False


GENERATION_IO = IoPolicy(
    {H2D: "input id H2D", D2H: "sampled id D2H", "sync": "sampled id read"}, {H2D: 1, D2H: 1, "sync": 1}
)
# A script's loop: a few batch tensors uploaded and one value (the loss) read back per step.
SCRIPT_IO = IoPolicy(
    {H2D: "input batch H2D", D2H: "value read D2H", "sync": "value read (loss or metric)"},
    {H2D: 4, D2H: 1, "sync": 1},
    scopes=("",),
    any_size_h2d=True,
)


def engine_io_groups(stats: TraceStats, tokens: int, policy: IoPolicy = GENERATION_IO) -> tuple[set, list[str]]:
    """Keys of the groups accepted as the engine's needed I/O, and a line describing each."""
    accepted, lines = set(), []
    used: dict[str, Counter] = defaultdict(Counter)  # slot → count per step
    for key, group in sorted(stats.groups.items(), key=lambda kv: kv[1].first_seq):
        slot = _io_slot(group, stats.tiny_bytes, policy)
        cap = policy.capacity.get(slot, 0)
        if slot is None or any(used[slot][s] + c > cap for s, c in group.steps.items()):
            continue
        used[slot].update(group.steps)
        if group.blocking or (group.kind == SYNC and group.direction == D2H):
            used["sync"].update(group.steps)  # a blocking read is also the step's one sync
        accepted.add(key)
        lines.append(f"{policy.names[slot]}: {group.count}× {_ops_text(group)} at {group.source or '?'}")
    return accepted, lines


def _io_slot(group: Group, tiny_bytes: int, policy: IoPolicy) -> str | None:
    """Which needed I/O a group could be: only outside the model, and after the prompt upload
    (step 0, any size) only a few ids' worth of bytes per copy (logits or activations are not)."""
    if group.module not in policy.scopes:
        return None
    prompt_upload = group.direction == H2D and (policy.any_size_h2d or set(group.steps) == {0})
    if not prompt_upload and group.bytes_moved > tiny_bytes * max(group.count, 1):
        return None
    if group.direction in (H2D, D2H) and group.kind in (TRANSFER, SYNC):
        return group.direction
    return "sync" if group.kind == SYNC else None


def build_findings(
    stats: TraceStats, opts: TraceOptions, tokens: int, accepted: set, unit: str = "token"
) -> list[Finding]:
    storms, absorbed = _storms(stats, opts, tokens, unit)
    rest = [
        g
        for k, g in stats.groups.items()
        if k not in accepted and (g.module, g.source) not in absorbed and not _setup_only(g, tokens, unit)
    ]
    findings = storms + [_merged_finding(gs, opts.target, tokens, unit) for gs in _merge(rest)]
    return sorted(findings, key=lambda f: (_SEVERITY[f.severity], -f.evidence.get("host_ms", 0.0)))


_SEVERITY = {"high": 0, "medium": 1, "low": 2}


def _setup_only(group: Group, tokens: int, unit: str) -> bool:
    """A script's step 0 holds its setup: a model built on the host and then moved (`Net().to(dev)`,
    the usual idiom) computes its initial weights there once. What happens in step 0 alone, in a run
    of several steps, costs once, not per step. A generation's step 0 is its prompt: it counts."""
    return unit != "token" and tokens > 1 and set(group.steps) <= {0}


def _storms(stats: TraceStats, opts: TraceOptions, tokens: int, unit: str) -> tuple[list[Finding], set]:
    per_place: dict[tuple, Counter] = defaultdict(Counter)  # (pattern, source) → step → count
    for (step, _kind, pattern, source), n in stats.tiny.items():
        per_place[(pattern, source)][step] += n
    hot = {place: steps for place, steps in per_place.items() if max(steps.values()) >= opts.storm_min_count}
    findings = []
    for (pattern, source), steps in hot.items():
        groups = [g for g in stats.groups.values() if (g.module, g.source) == (pattern, source)]
        findings.append(_storm_finding(pattern, source, steps, groups, opts.target, tokens, unit))
    return findings, set(hot)


def _storm_finding(pattern, source, steps: Counter, groups: list[Group], target, tokens, unit) -> Finding:
    where = source or "an unknown line (trace with source lines on)"
    what = ", ".join(f"{_kind_text(g)} ×{count_rate(decode_rate(g, tokens))}/{unit}" for g in groups)
    mod = _mod_text((pattern,)) if unit == "token" or pattern else "(script, outside any module)"
    ev = _evidence(groups, tokens, unit)
    ev.update(max_per_step=max(steps.values()), steps_with_storm=len(steps))
    return Finding(
        STORM,
        "high",
        f"{mod}: {max(steps.values())} tiny transfers/syncs in one step at {where} ({what}): a per-element loop",
        (pattern,),
        (source,) if source else (),
        ev,
        f"replace the per-element Python loop at {where} with one tensor op on {target} "
        f"(e.g. dst.copy_(src), torch.cat, indexing with a tensor), and read values back at most once",
    )


def _merge(groups: list[Group]) -> list[list[Group]]:
    """Groups of one module pattern together; then patterns with the same source lines together."""
    by_pattern: dict[str, list[Group]] = defaultdict(list)
    for g in groups:
        by_pattern[g.module].append(g)
    by_sources: dict[tuple, list[Group]] = defaultdict(list)
    for pattern, gs in by_pattern.items():
        sources = tuple(sorted({g.source for g in gs if g.source}))
        by_sources[sources or (pattern,)].extend(gs)
    return [sorted(gs, key=lambda g: g.first_seq) for gs in by_sources.values()]


def _merged_finding(groups: list[Group], target: str, tokens: int, unit: str) -> Finding:
    kinds = {g.kind for g in groups}
    kind = next(k for k in (FALLBACK, MIXED, TRANSFER, SYNC) if k in kinds)
    patterns = tuple(dict.fromkeys(g.module for g in groups))
    sources = tuple(dict.fromkeys(g.source for g in groups if g.source))
    ev = _evidence(groups, tokens, unit)
    title, fix = _TEXT[kind](groups, patterns, target, ev)
    if unit != "token":  # the texts below speak of a generation's tokens; a script's steps read the same
        title = title.replace(" per token", f" per {unit}").replace(_ENGINE_LOOP, "(script, outside any module)")
    severity = "high" if kind in (FALLBACK, MIXED) or ev["count_per_token"] > 2 else "medium"
    return Finding(kind, severity, title, patterns, sources, ev, fix)


def _evidence(groups: list[Group], tokens: int, unit: str = "token") -> dict:
    ops: Counter = Counter()
    for g in groups:
        ops.update(g.ops)
    per_dir: defaultdict[str, float] = defaultdict(float)  # transfers per token, by direction
    for g in groups:
        if g.direction and g.kind != MIXED:
            per_dir[g.direction] += decode_rate(g, tokens)
    modules = sorted({m for g in groups for m in g.modules})
    return {
        "count": sum(g.count for g in groups),
        "count_per_token": round(sum(decode_rate(g, tokens) for g in groups), 3),
        "host_ms": round(sum(g.host_ns for g in groups) / 1e6, 3),
        "bytes": sum(g.bytes_moved for g in groups),
        "transfers_per_token": {d: round(n, 3) for d, n in per_dir.items()},
        "syncs": sum(g.count for g in groups if g.kind == SYNC) + sum(g.blocking for g in groups),
        "ops": dict(ops.most_common(8)),
        "devices": sorted({d for g in groups for d in g.devices}),
        "modules": len(modules),
        "module_examples": modules[:4],
        "bytes_per_token": round(sum(decode_bytes(g, tokens) for g in groups)),
        "lines": _lines(groups, tokens, unit),
    }


def _lines(groups: list[Group], tokens: int, unit: str = "token") -> list[str]:
    """One line per source line and kind, over all module patterns: where, what, how often."""
    per_line: dict[tuple, list[Group]] = defaultdict(list)
    for g in groups:
        per_line[(g.source, g.kind, g.direction)].append(g)
    out = []
    for (source, kind, direction), gs in sorted(per_line.items(), key=lambda kv: str(kv[0][0])):
        ops: Counter = Counter()
        for g in gs:
            ops.update(g.ops)
        names = ", ".join(op.split(".")[1] for op, _ in ops.most_common(5))
        rate = sum(decode_rate(g, tokens) for g in gs)
        out.append(
            f"{source or '?'}: {kind} {direction}".rstrip()
            + f" ({names}) {count_rate(rate)}/{unit}, {sum(g.count for g in gs)} in all"
        )
    return out


def _fallback_text(groups, patterns, target, ev) -> tuple[str, str]:
    on_target = DeviceMatcher(target)  # "cuda" is every "cuda:N"
    devices = ", ".join(d for d in ev["devices"] if not on_target(d)) or "another device"
    compute = [g for g in groups if g.kind == FALLBACK]
    where = compute[0].source or "?"
    title = f"{_mod_text(patterns)}: compute runs on {devices} instead of {target} at {where} ({_ops_short(compute)})"
    moves = ev["transfers_per_token"]
    if moves:
        title += (
            ", with "
            + " + ".join(f"{count_rate(n)} {d}" for d, n in moves.items())
            + f" copies per token ({_kib(ev['bytes_per_token'])})"
        )
    d2h = next((g for g in groups if g.kind == TRANSFER and g.direction == D2H), None)
    if d2h is not None and patterns == ("",):
        fix = (
            f"keep this work on {target}: drop the copy to the host at {d2h.source or '?'} and bring back "
            f"only what the host needs (the sampled id, with one .item() per step)"
        )
    elif d2h is not None:
        fix = (
            f"keep {_mod_text(patterns)} on {target}: drop the copy to the host at {d2h.source or '?'} "
            f"and the copy back, and keep its weights/constants on the input's device"
        )
    else:
        fix = (
            f"create the tensors used at {where} on {target}: pass device=x.device to factory calls "
            f"(torch.empty/zeros/arange/tensor) or register constants as buffers so model.to() moves them"
        )
    return title, fix


def _transfer_text(groups, patterns, target, ev) -> tuple[str, str]:
    first = groups[0]
    per_dir = ", ".join(f"{count_rate(n)} {d}" for d, n in ev["transfers_per_token"].items()) or f"{ev['count']} copies"
    title = f"{_mod_text(patterns)} copies across devices at {first.source or '?'}: {per_dir} per token"
    if first.direction == H2D:
        fix = f"create that tensor on {target} once (register_buffer or device=...) instead of copying it every step"
    else:
        fix = f"keep the computation on {target}; read results back once, after the loop"
    return title, fix


def _sync_text(groups, patterns, target, ev) -> tuple[str, str]:
    first = groups[0]
    title = (
        f"{_mod_text(patterns)} makes the host wait for {target} at {first.source or '?'}: "
        f"{count_rate(ev['count_per_token'])} syncs per token ({_ops_short(groups)})"
    )
    fix = (
        "keep the value on the device (torch.where / masks instead of Python branching on .item(), "
        "fixed-size outputs instead of nonzero/boolean indexing) or read it once per step"
    )
    return title, fix


def _mixed_text(groups, patterns, target, ev) -> tuple[str, str]:
    first = groups[0]
    title = (
        f"{_mod_text(patterns)} mixes {' and '.join(ev['devices'])} tensors in one op at "
        f"{first.source or '?'} ({_ops_short(groups)}): an implicit copy each call"
    )
    fix = f"move the host inputs of that op (indices, masks, constants) to {target} once, ahead of the loop"
    return title, fix


_TEXT = {FALLBACK: _fallback_text, TRANSFER: _transfer_text, SYNC: _sync_text, MIXED: _mixed_text}


def _kib(n: float) -> str:
    return f"{n / 1024:.1f} KiB" if n >= 1024 else f"{n:.0f} B"


def _mod_text(patterns) -> str:
    names = [p if p not in ("",) else _ENGINE_LOOP for p in patterns]
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _kind_text(group: Group) -> str:
    return f"{group.kind} {group.direction}".strip() + f" ({_ops_text(group)})"


def _ops_text(group: Group) -> str:
    return ", ".join(op.split(".")[1] for op, _ in group.ops.most_common(3))


def _ops_short(groups: list[Group]) -> str:
    ops: Counter = Counter()
    for g in groups:
        ops.update(g.ops)
    return ", ".join(op.split(".")[1] for op, _ in ops.most_common(5))
