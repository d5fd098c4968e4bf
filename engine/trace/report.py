"""The placement report: where ops ran, what crossed devices, what made the host wait, and what
to change, from a TraceResult's counters (exact past the event cap).

Per-token figures are over decode steps: the ops between consecutive generated tokens. Step 0
(prefill and the first token) is reported apart. What a correct engine needs per decode step on
an accelerator is one host→device copy (the input id) and one device→host read that waits (the
sampled id); every other transfer, sync or off-target op is a finding.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from opscope.engine.trace.aggregate import Group, TraceStats
from opscope.engine.trace.capture import TraceResult
from opscope.engine.trace.events import DIRECTIONS, FALLBACK, KINDS, MIXED, ON_TARGET, SYNC, TRANSFER
from opscope.engine.trace.findings import (
    GENERATION_IO,
    Finding,
    IoPolicy,
    build_findings,
    decode_rate,
    engine_io_groups,
)


@dataclass(frozen=True)
class TransferSummary:
    direction: str
    count: int
    bytes: int
    per_token_count: float
    per_token_bytes: float
    pinned: int = 0  # host side pinned / pageable, where the copy could tell
    pageable: int = 0


@dataclass(frozen=True)
class GroupRow:
    kind: str
    direction: str
    module: str
    source: str | None
    count: int
    per_token: float
    host_ms: float
    bytes: int
    ops: dict[str, int]


@dataclass(frozen=True)
class PlacementReport:
    target: str
    tokens: int
    decode_steps: int
    ops: int
    stored_events: int
    dropped_events: int
    ops_on_target_pct: float
    time_on_target_pct: float
    time_basis: str  # "device" (CUDA event times) or "host" (wall time around each op)
    by_kind: dict[str, dict]
    transfers: list[TransferSummary]
    syncs: int
    syncs_per_token: float
    fallbacks: list[GroupRow]
    off_target_groups: list[GroupRow]
    findings: list[Finding]
    expected: list[str] = field(default_factory=list)  # engine I/O accepted as needed
    notes: list[str] = field(default_factory=list)
    source_lines: str = "findings"
    unit: str = "token"  # what a step is: a generated token, or a step of a user's script

    @property
    def clean(self) -> bool:
        return not self.findings

    def as_dict(self) -> dict:
        d = asdict(self)
        d["clean"] = self.clean
        return d


def build_report(
    result: TraceResult, notes: list[str] | None = None, *, unit: str = "token", io: IoPolicy = GENERATION_IO
) -> PlacementReport:
    """``unit``/``io``: "token" and the engine's I/O for a generation; a script's trace passes
    "step" and engine.trace.findings.SCRIPT_IO."""
    stats, opts = result.stats, result.options
    tokens = result.tokens
    decode_steps = max(tokens - 1, 0)
    expected_keys, expected = engine_io_groups(stats, tokens, io)
    findings = build_findings(stats, opts, tokens, expected_keys, unit)
    use_device = bool(stats.kind_device_ns)
    times = stats.kind_device_ns if use_device else stats.kind_host_ns
    total_time = sum(times.values()) or 1
    return PlacementReport(
        target=opts.target,
        tokens=tokens,
        decode_steps=decode_steps,
        ops=stats.ops,
        stored_events=len(result.events),
        dropped_events=result.dropped,
        ops_on_target_pct=100.0 * stats.kind_count[ON_TARGET] / (stats.ops or 1),
        time_on_target_pct=100.0 * times[ON_TARGET] / total_time,
        time_basis="device" if use_device else "host",
        by_kind=_by_kind(stats, times, total_time),
        transfers=_transfers(stats, tokens),
        syncs=stats.syncs_total(),
        syncs_per_token=_syncs_per_token(stats, tokens),
        fallbacks=[_row(g, tokens) for g in _sorted(stats, (FALLBACK,))],
        off_target_groups=[_row(g, tokens) for g in _sorted(stats, (TRANSFER, SYNC, MIXED))],
        findings=findings,
        expected=expected,
        notes=list(notes or []),
        source_lines=opts.source,
        unit=unit,
    )


def _by_kind(stats: TraceStats, times, total_time: int) -> dict[str, dict]:
    return {
        k: {
            "count": stats.kind_count[k],
            "pct": 100.0 * stats.kind_count[k] / (stats.ops or 1),
            "ms": times[k] / 1e6,
            "time_pct": 100.0 * times[k] / total_time,
        }
        for k in KINDS
        if stats.kind_count[k]
    }


def _decode_steps(stats: TraceStats, tokens: int) -> list:
    return [c for s, c in stats.steps.items() if 1 <= s < tokens] if tokens > 1 else list(stats.steps.values())


def _transfers(stats: TraceStats, tokens: int) -> list[TransferSummary]:
    decode = _decode_steps(stats, tokens)
    n = max(len(decode), 1) if tokens > 1 else max(tokens, 1)
    out = []
    for direction in DIRECTIONS:
        groups = [g for g in stats.groups.values() if g.kind in (TRANSFER, SYNC) and g.direction == direction]
        count = sum(g.count for g in groups)
        if not count:
            continue
        out.append(
            TransferSummary(
                direction,
                count,
                sum(g.bytes_moved for g in groups),
                sum(s.transfers[direction] for s in decode) / n,
                sum(s.transfer_bytes[direction] for s in decode) / n,
                pinned=sum(g.pinned for g in groups),
                pageable=sum(g.pageable for g in groups),
            )
        )
    return out


def _syncs_per_token(stats: TraceStats, tokens: int) -> float:
    decode = _decode_steps(stats, tokens)
    n = max(len(decode), 1) if tokens > 1 else max(tokens, 1)
    return sum(s.syncs for s in decode) / n


def _sorted(stats: TraceStats, kinds: tuple[str, ...]) -> list[Group]:
    return sorted((g for g in stats.groups.values() if g.kind in kinds), key=lambda g: (-g.host_ns, g.first_seq))


def _row(group: Group, tokens: int) -> GroupRow:
    return GroupRow(
        group.kind,
        group.direction,
        group.module,
        group.source,
        group.count,
        decode_rate(group, tokens),
        group.host_ns / 1e6,
        group.bytes_moved,
        dict(group.ops.most_common()),
    )
