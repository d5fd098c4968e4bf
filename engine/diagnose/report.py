"""A diagnosis in words: at most ~10 lines of text (a headline, then each finding with its evidence,
place, fix and gain), Markdown for a file, the JSON summary a saved run keeps, and the difference of
two saved diagnoses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opscope.engine.diagnose.measurement import Finding, Measurement
from opscope.engine.diagnose.rules import bound_line, diagnose

SUMMARY_VERSION = 1
SHOWN = 4  # findings in the text: two lines each, under the headline


@dataclass(frozen=True)
class Diagnosis:
    measurement: Measurement
    findings: tuple[Finding, ...]

    @classmethod
    def of(cls, m: Measurement) -> Diagnosis:
        return cls(m, tuple(diagnose(m)))

    @property
    def disturbed(self) -> bool:
        return any(f.rule == "foreign-load" for f in self.findings)

    def summary(self) -> dict[str, Any]:
        """What a saved run of kind ``diagnosis`` keeps (RunResult.trace_summary)."""
        return {
            "version": SUMMARY_VERSION,
            "headline": headline(self),
            "bound": bound_line(self.measurement),
            "disturbed": self.disturbed,
            "measurement": self.measurement.as_dict(),
            "findings": [f.as_dict() for f in self.findings],
        }

    @classmethod
    def from_summary(cls, s: dict[str, Any]) -> Diagnosis:
        return cls(Measurement.from_dict(s["measurement"]), tuple(Finding(**f) for f in s["findings"]))


def _phase_text(m: Measurement) -> list[str]:
    if m.simulated:
        return [
            f"{p.name} {p.ops:.0f} ops" + (f" ({p.tokens} tok)" if p.name == "prefill" else f" per {m.unit}")
            for p in m.phases
        ]
    out = []
    for p in m.phases:
        what = (
            f"{p.name} {p.tokens} tok {p.wall_ms:.0f} ms"
            if p.name == "prefill"
            else (f"{p.name} {1000.0 / p.wall_ms:.3g} {m.unit}/s ({p.wall_ms:.3g} ms" if p.wall_ms else f"{p.name} (")
        )
        if p.name != "prefill":
            what += f", {p.ops:.0f} ops" + (
                f", {100 * p.op_ms / p.wall_ms:.0f} % in ops" if p.op_ms and p.wall_ms and m.kind == "script" else ""
            )
            what += (f", device busy {p.device_busy_pct:.0f} %" if p.device_busy_pct is not None else "") + ")"
        out.append(what)
    return out


def headline(d: Diagnosis) -> str:
    m = d.measurement
    sim = " (simulated: placement real, times not)" if m.simulated else ""
    dist = " [figures disturbed]" if d.disturbed else ""
    return f"diagnose {m.subject} on {m.target}{sim}: {' · '.join(_phase_text(m))} · bound: {bound_line(m)}{dist}"


def finding_lines(i: int, f: Finding) -> list[str]:
    where = f"at {f.place} · " if f.place else ""
    return [
        f"{i}. [{f.severity}] {f.bound}: {f.evidence}",
        f"   {where}fix: {f.fix}" + (f" · gain: {f.gain}" if f.gain else ""),
    ]


def render_text(d: Diagnosis, shown: int = SHOWN) -> str:
    lines = [headline(d)]
    for i, f in enumerate(d.findings[:shown], 1):
        lines += finding_lines(i, f)
    if not d.findings:
        lines.append("no finding: nothing above info")
    if len(d.findings) > shown:
        lines.append(f"(+{len(d.findings) - shown} more: --json or --markdown FILE)")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(d: Diagnosis) -> str:
    m = d.measurement
    lines = [
        f"# Diagnosis: {m.subject}",
        "",
        headline(d),
        "",
        "| # | severity | bound | evidence | place | fix | expected gain |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for i, f in enumerate(d.findings, 1):
        lines.append(
            f"| {i} | {f.severity} | {f.bound} | {_cell(f.evidence)} | {_cell(f.place)} | "
            f"{_cell(f.fix)} | {_cell(f.gain)} |"
        )
    ceilings = [c for c in (m.peak_flop_label, m.peak_bytes_label) if c]
    lines += ["", "Ceilings: " + ("; ".join(ceilings) or "none known (simulated device)")]
    if m.dispatch_us:
        lines.append(f"Host cost of one op (measured): {m.dispatch_us:.3g} µs")
    lines += [f"- {n}" for n in m.notes]
    return "\n".join(lines) + "\n"


def _key(f: dict) -> tuple:
    """What makes two findings the same across runs: the code place, or for a bound the phase (its
    top module may change), or for foreign load the rule alone (the neighbours do)."""
    if f["rule"] == "foreign-load":
        return (f["rule"],)
    phase = (f.get("data") or {}).get("phase")
    return (f["rule"], phase) if phase else (f["rule"], f["place"])


def diff(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """What changed from diagnosis A to diagnosis B (two saved summaries)."""
    ka, kb = {_key(f): f for f in a["findings"]}, {_key(f): f for f in b["findings"]}
    walls: dict[str, list] = {}
    for s, side in ((a, 0), (b, 1)):
        for p in s["measurement"]["phases"]:
            timed = not s["measurement"].get("simulated")
            walls.setdefault(p["name"], [None, None])[side] = p["wall_ms"] if timed else None
    return {
        "bound": (a["bound"], b["bound"]),
        "phases_ms": {k: tuple(v) for k, v in walls.items()},
        "gone": [f for k, f in ka.items() if k not in kb],
        "new": [f for k, f in kb.items() if k not in ka],
        "kept": [f for k, f in kb.items() if k in ka],
        "disturbed": (a["disturbed"], b["disturbed"]),
    }


def render_diff(d: dict[str, Any], name_a: str, name_b: str) -> str:
    lines = [f"diagnose diff: A = {name_a}, B = {name_b}", f"bound: {d['bound'][0]}  →  {d['bound'][1]}"]
    for phase, (x, y) in d["phases_ms"].items():
        ratio = f" ({x / y:.2f}× faster)" if x and y else ""
        lines.append(f"{phase}: {_ms(x)} → {_ms(y)} per pass{ratio}")
    for label, found in (("gone in B", d["gone"]), ("new in B", d["new"]), ("still there", d["kept"])):
        lines.append(f"{label}: {len(found) or 'none'}")
        lines += [f"  [{f['severity']}] {f['bound']}: {f['evidence']}" for f in found]
    if any(d["disturbed"]):
        lines.append(
            "note: "
            + " and ".join(n for n, x in zip("AB", d["disturbed"], strict=True) if x)
            + " disturbed by foreign load"
        )
    return "\n".join(lines) + "\n"


def _ms(v: float | None) -> str:
    return "—" if v is None else f"{v:.3g} ms"
