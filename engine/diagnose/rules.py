"""The diagnosis rules, as data: RULES is one table, a row per finding (its name, the bound it names,
where it ranks, and a pure function of a Measurement that returns the finding or None). Each function
holds the rule's condition, evidence, wording, fix and expected gain; each is tested alone with a
Measurement written by hand (tests/engine/diagnose/test_diagnose_rules.py). docs/diagnose.md lists the table.

Bounds of a phase (prefill, decode, a script's step), from the same measurement: the time its work
needs at the compute ceiling (FLOP ÷ peak FLOP/s), at the bandwidth ceiling (bytes ÷ peak bytes/s)
and for the host to dispatch its ops (ops × the measured cost of one tiny op). The largest names the
bound, as a roofline with a third roof for the host.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from opscope.engine.core.units import count_rate, format_bytes, format_rate
from opscope.engine.diagnose.measurement import DECODE, SEVERITIES, Finding, Issue, Measurement, Phase

DISTURBED_CORES = 0.25  # as engine.bench.measure.quality: foreign load that marks figures disturbed
HOST_ALONE = 0.25  # the host's roof, with no other roof known, must explain this part of the busy pass
IDLE_PCT = 40.0  # share of a step with no op running that points at the input pipeline
INT8_SAVES = 0.10  # int8 activations must take this part off a decode step for the finding
EXTRA_TRANSFERS = 1  # copies per step beyond the needed I/O (engine.diagnose.measure: MODEL_NEEDED, SCRIPT_NEEDED)
COMPUTE, MEMORY, HOST = "compute", "memory", "host"


def _ms(x: float) -> str:
    return f"{x:.3g} ms" if x < 10 else f"{x:.0f} ms"


def _rate(tokens: float, ms: float) -> str:
    return f"{tokens * 1000.0 / ms:.3g}"


def _place(module: str, source: str) -> str:
    return " at ".join(s for s in (module, source) if s)


# --- the three roofs of a phase -------------------------------------------------------------------


def roofs(m: Measurement, p: Phase) -> dict[str, float]:
    """ms one pass of ``p`` needs at each known ceiling: compute, memory, and the host's, which is
    its ops × the measured cost of issuing one empty op through a module (engine.diagnose.probes)."""
    out = {}
    if p.flop and m.peak_flop_s:
        out[COMPUTE] = p.flop / m.peak_flop_s * 1000.0
    if p.bytes and m.peak_bytes_s:
        out[MEMORY] = p.bytes / m.peak_bytes_s * 1000.0
    if p.ops and m.dispatch_us:
        out[HOST] = min(p.ops * m.dispatch_us / 1000.0, p.wall_ms)  # issuing cannot take longer than the pass
    return out


def bound_of(m: Measurement, p: Phase) -> str | None:
    """The largest roof of ``p`` (None: simulated times or no roof known). A pass slower than every
    roof is still held by its largest: what is left is overhead, foreign load or a poor kernel. With
    the host's roof alone (a script: no FLOP or bytes known) it must explain a quarter of the busy
    part of the pass (the wall less the input wait) to name the bound."""
    r = roofs(m, p)
    if m.simulated or not r:
        return None
    busy_ms = p.wall_ms * (1.0 - (m.idle_pct or 0.0) / 100.0)
    if set(r) == {HOST} and r[HOST] < HOST_ALONE * busy_ms:
        return None
    return max(r, key=lambda k: r[k])


def _held(m: Measurement, bound: str) -> Phase | None:
    """Of the phases ``bound`` holds, the one it holds most tightly (its roof nearest the wall time:
    a batch-1 decode at 45 % of the bandwidth, not a short prefill at 5 %)."""
    found = [p for p in m.phases if bound_of(m, p) == bound]
    return max(found, key=lambda p: roofs(m, p)[bound] / max(p.wall_ms, 1e-9)) if found else None


def _what(m: Measurement, p: Phase) -> str:
    if p.name == "prefill":
        return f"prefill of {p.tokens} tokens"
    return p.name + (f" ({m.unit})" if p.name == "step" else "")


# --- rules -------------------------------------------------------------------------------------


def foreign_load(m: Measurement) -> Finding | None:
    if m.simulated:
        return None  # op counts and placement do not depend on the machine's load
    busy = m.other_cores is not None and m.other_cores >= DISTURBED_CORES
    if not busy and not m.other_gpu_procs:
        return None
    who = ", ".join(f"pid {n.pid} {n.name} ({n.cores:.2f} cores)" for n in m.neighbours[:2])
    held = [f"other processes kept {m.other_cores:.2f} of {m.cores or '?'} cores busy"] if busy else []
    held += [f"{m.other_gpu_procs} other process(es) used the GPU"] if m.other_gpu_procs else []
    free = max(m.cores - (m.other_cores or 0.0), 1.0) if m.cores else None
    gain = (
        f"up to ×{m.cores / free:.2g} for work that uses all {m.cores} cores"
        if free and busy
        else "figures taken on a quiet machine"
    )
    return Finding(
        "foreign-load",
        "foreign load",
        "high",
        f"{'; '.join(held)} during the measurement: every figure here is disturbed",
        who,
        "stop them or rerun on a quiet machine; on the CPU give them a core (--threads N-1)",
        gain,
        100.0,
        {"other_cores": m.other_cores, "other_gpu_procs": m.other_gpu_procs},
    )


def _issue_finding(m: Measurement, rule: str, bound: str, i: Issue) -> Finding:
    what = "syncs" if i.kind in ("storm", "sync") else "off-target ops/copies"
    gain = f"{count_rate(i.per_step)} {what} per {m.unit} go away"
    step = m.phase("decode") or m.phase("step")
    share = 0.0
    if i.host_ms and m.traced_steps and step is not None and not m.simulated:
        per_step = i.host_ms / m.traced_steps
        share = 100.0 * min(per_step / step.wall_ms, 1.0) if step.wall_ms else 0.0
        gain += f", with ~{_ms(per_step)} of host time per {m.unit} (traced; the {m.unit} takes {_ms(step.wall_ms)})"
    elif m.simulated:
        gain += " (times simulated: on the device each round trip waits for the link and a sync)"
    return Finding(
        rule,
        bound,
        i.severity if i.severity != "low" else "medium",
        i.title,
        _place(i.module, i.source),
        i.fix,
        gain,
        share,
        {"kind": i.kind},
    )


def placement(m: Measurement) -> Finding | None:
    found = [i for i in m.issues if i.kind in ("fallback", "mixed")]
    return _issue_finding(m, "placement", "placement", max(found, key=lambda i: i.host_ms)) if found else None


def storm(m: Measurement) -> Finding | None:
    found = [i for i in m.issues if i.kind == "storm"]
    return _issue_finding(m, "storm", "host (syncs)", max(found, key=lambda i: i.per_step)) if found else None


def training(m: Measurement) -> Finding | None:
    found = [i for i in m.issues if i.kind not in ("fallback", "mixed", "storm", "transfer", "sync")]
    if not found:
        return None
    i = found[0]
    return Finding(
        "training",
        "training",
        "high",
        i.title,
        _place(i.module, i.source),
        i.fix,
        "the steps' time buys learning again",
        0.0,
        {"kind": i.kind},
    )


def syncs(m: Measurement) -> Finding | None:
    found = [i for i in m.issues if i.kind in ("sync", "transfer")]
    return _issue_finding(m, "syncs", "host (syncs)", max(found, key=lambda i: i.per_step)) if found else None


def data_movement(m: Measurement) -> Finding | None:
    if m.transfers_per_step < EXTRA_TRANSFERS or not m.transfer_bytes_per_step:
        return None
    moved = format_bytes(m.transfer_bytes_per_step)
    cost = (
        f" = {_ms(m.transfer_bytes_per_step / m.link_bytes_s * 1000)} at the link's "
        f"{format_rate(m.link_bytes_s, 'B/s')}"
        if m.link_bytes_s and not m.simulated
        else ""
    )
    pageable = f", {m.pageable_transfers} from pageable memory" if m.pageable_transfers else ""
    return Finding(
        "data-movement",
        "data movement",
        "medium",
        f"{count_rate(m.transfers_per_step)} host↔device copies per {m.unit} beyond the needed I/O; "
        f"all copies move {moved}{cost}{pageable}",
        "",
        "keep tensors on the device between steps; upload a batch once, from pinned memory "
        "(pin_memory=True, non_blocking=True)",
        f"{moved} per {m.unit} not copied" + cost,
        0.0,
        {"bytes_per_step": m.transfer_bytes_per_step, "per_step": m.transfers_per_step},
    )


def input_pipeline(m: Measurement) -> Finding | None:
    step = m.phase("step")
    if step is None or m.idle_pct is None or m.idle_pct < IDLE_PCT:
        return None
    idle_ms = step.wall_ms * m.idle_pct / 100.0
    on = f" while the host runs {m.idle_source} ({m.idle_source_pct:.0f} % of the samples)" if m.idle_source else ""
    return Finding(
        "input-pipeline",
        "input pipeline",
        "medium",
        f"no op runs for {m.idle_pct:.0f} % of each step ({_ms(idle_ms)} of {_ms(step.wall_ms)}){on}: "
        f"the device waits for the input",
        m.idle_source,
        "prepare batches ahead: a DataLoader with num_workers>0 and prefetching, or tensors built "
        "once outside the loop",
        f"steps up to ×{step.wall_ms / max(step.wall_ms - idle_ms, 1e-3):.2g} "
        f"faster ({_ms(step.wall_ms - idle_ms)} per step)",
        m.idle_pct,
        {"idle_pct": m.idle_pct},
    )


def host_bound(m: Measurement) -> Finding | None:
    p = _held(m, HOST)
    if p is None:
        return None
    r = roofs(m, p)
    work = max(r.get(COMPUTE, 0.0), r.get(MEMORY, 0.0), 1e-6)
    per_op = p.wall_ms * 1000.0 / p.ops
    idle = f"; the device idles {100 - p.device_busy_pct:.0f} % of it" if p.device_busy_pct is not None else ""
    return Finding(
        "host-bound",
        "host",
        "medium",
        f"{_what(m, p)} runs {p.ops:.0f} ops in {_ms(p.wall_ms)} ({per_op:.2g} µs each); issuing them "
        f"costs ≥ {_ms(r[HOST])} ({m.dispatch_us:.2g} µs per empty op, measured), their work needs "
        f"~{_ms(work)}{idle}: host-bound",
        _place(p.busiest_module, p.busiest_source) or _place(p.top_module, p.top_source),  # a run saved before
        "fewer, larger ops: torch.compile (--compile decode), CUDA graphs on a GPU, fused kernels "
        "(the CPU fast path), or a larger batch per op",
        f"with the ops fused the work alone allows ~{_rate(p.tokens, max(work, r[HOST] / p.ops))} "
        f"{m.unit}/s, you get {_rate(p.tokens, p.wall_ms)}",
        m.share_pct(p),
        {"roofs_ms": r, "phase": p.name},
    )


def compute_bound(m: Measurement) -> Finding | None:
    p = _held(m, COMPUTE)
    if p is None or p.flop is None or m.peak_flop_s is None:
        return None
    achieved = p.flop / p.wall_ms * 1000.0
    need = roofs(m, p)[COMPUTE]
    return Finding(
        "compute-bound",
        "compute",
        "info",
        f"{_what(m, p)}: {p.flop / 1e9:.3g} GFLOP per pass at {format_rate(achieved, 'FLOP/s', 3)} = "
        f"{100 * achieved / m.peak_flop_s:.0f} % of the {m.peak_flop_label}: compute-bound (MFU)",
        _place(p.top_module, p.top_source),
        "fewer FLOPs or faster ones: bfloat16/float16 matmuls where the device has them, a quantized "
        "fast path; a larger batch does not help a compute-bound pass",
        f"ceiling ~{_rate(p.tokens, need)} {m.unit}/s, you get {_rate(p.tokens, p.wall_ms)}",
        m.share_pct(p),
        {"mfu_pct": 100 * achieved / m.peak_flop_s, "phase": p.name},
    )


def memory_bound(m: Measurement) -> Finding | None:
    p = _held(m, MEMORY)
    if p is None or p.bytes is None or m.peak_bytes_s is None:
        return None
    achieved = p.bytes / p.wall_ms * 1000.0
    need = roofs(m, p)[MEMORY]
    per = "token" if p.name == "decode" else "pass"
    return Finding(
        "memory-bound",
        "memory",
        "info",
        f"{_what(m, p)} reads {format_bytes(p.bytes, 3)} per {per} at {format_rate(achieved, 'B/s', 3)} = "
        f"{100 * achieved / m.peak_bytes_s:.0f} % of the {m.peak_bytes_label}: memory-bound (MBU)",
        _place(p.top_module, p.top_source),
        "read fewer bytes per token: int8/int4 or Q8_0/Q4 weights, bfloat16 weights, or batch "
        "several sequences so each weight read serves them all",
        f"ceiling ~{_rate(p.tokens, need)} {m.unit}/s, you get {_rate(p.tokens, p.wall_ms)}",
        m.share_pct(p),
        {"mbu_pct": 100 * achieved / m.peak_bytes_s, "phase": p.name},
    )


def exact_activations(m: Measurement) -> Finding | None:
    p = m.phase(DECODE)
    if m.simulated or p is None or not p.wall_ms or m.matvec_exact_ms is None or m.matvec_int8_ms is None:
        return None
    saved = min(m.matvec_exact_ms - m.matvec_int8_ms, p.wall_ms)
    if saved < INT8_SAVES * p.wall_ms:
        return None
    return Finding(
        "exact-activations",
        "dequantize arithmetic",
        "low",
        f"decode ({_ms(p.wall_ms)} a token): one pass over the fast path's matvecs took {_ms(m.matvec_exact_ms)} "
        f"in exact float32 and {_ms(m.matvec_int8_ms)} with int8 activations here: converting each weight to "
        "float32 and multiplying it, not reading it, sets the pace",
        f"the quantized linears ({m.matvec_types})",
        "int8 activations, llama.cpp's scheme (`--fastpath activations=q8`; in the window, Engine → "
        "Settings…, Decode activations: q8): the logits move slightly (the embedded model: mean KL 3.9e-3 per token "
        "against exact, about llama.cpp's own)",
        f"~{_rate(1, p.wall_ms - saved)} {m.unit}s/s instead of {_rate(1, p.wall_ms)}",
        m.share_pct(p),
        {"exact_ms": m.matvec_exact_ms, "int8_ms": m.matvec_int8_ms, "phase": p.name},
    )


@dataclass(frozen=True)
class Rule:
    name: str
    bound: str
    rank: int  # findings of one severity: lower rank first; equal ranks by their share of the time
    check: Callable[[Measurement], Finding | None]
    summary: str  # for docs/diagnose.md and --help


RULES: tuple[Rule, ...] = (
    Rule("placement", "placement", 0, placement, "compute off the target device or mixed-device ops (trace findings)"),
    Rule("storm", "host (syncs)", 1, storm, "a per-element loop: ≥ 16 tiny transfers/syncs from one line in one step"),
    Rule("training", "training", 2, training, "the loss does not fall, no gradient, optimizer not on the model"),
    Rule(
        "foreign-load",
        "foreign load",
        3,
        foreign_load,
        "other processes held ≥ 0.25 cores or the GPU: figures disturbed",
    ),
    Rule("syncs", "host (syncs)", 4, syncs, "transfers or host waits beyond the needed I/O"),
    Rule(
        "data-movement", "data movement", 5, data_movement, "≥ 1 host↔device copy per step/token beyond the needed I/O"
    ),
    Rule("input-pipeline", "input pipeline", 6, input_pipeline, "no op runs for ≥ 40 % of a script's step"),
    Rule("host-bound", "host", 7, host_bound, "ops × the cost of an empty op is the largest roof"),
    Rule(
        "exact-activations",
        "dequantize arithmetic",
        8,
        exact_activations,
        "the fast path's exact matvecs take ≥ 10 % more of a decode step than int8 activations would",
    ),
    Rule("compute-bound", "compute", 8, compute_bound, "FLOP ÷ peak FLOP/s is the largest roof (MFU)"),
    Rule("memory-bound", "memory", 8, memory_bound, "bytes ÷ measured bandwidth is the largest roof (MBU)"),
)


def diagnose(m: Measurement, rules: tuple[Rule, ...] = RULES) -> list[Finding]:
    """Every rule's finding, most important first: severity, then rank, then share of the time."""
    found = [(r.rank, f) for r in rules if (f := r.check(m)) is not None]
    found.sort(key=lambda rf: (SEVERITIES.index(rf[1].severity), rf[0], -rf[1].share_pct))
    return [f for _, f in found]


def bound_line(m: Measurement) -> str:
    """What bounds each phase, in one line ("prefill: compute, decode: memory")."""
    if m.simulated:
        return "not timed (simulated device)"
    parts = [f"{p.name}: {bound_of(m, p) or 'unknown'}" for p in m.phases]
    return ", ".join(parts) if parts else "no timed phase"
