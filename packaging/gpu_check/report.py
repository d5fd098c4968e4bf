"""report.json (everything) and report.md (what a person reads first) of one GPU check run."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from harness import Outcome


def verdict(outcomes: list[Outcome]) -> tuple[int, str]:
    """The exit code and the one line that says it: non-zero naming every failed check."""
    failed = [o.name for o in outcomes if o.status == "fail"]
    if failed:
        return 1, f"gpu-check: FAILED: {', '.join(failed)}"
    skipped = sum(o.status == "skip" for o in outcomes)
    passed = sum(o.status == "pass" for o in outcomes)
    return 0, f"gpu-check: ok: {passed} passed, {skipped} skipped"


def write(out: Path, meta: dict[str, Any], outcomes: list[Outcome]) -> None:
    code, line = verdict(outcomes)
    doc = {
        "format": "opscope-gpu-check/1",
        **meta,
        "verdict": line,
        "exit_code": code,
        "checks": [o.as_dict() for o in outcomes],
    }
    (out / "report.json").write_text(json.dumps(_finite(doc), indent=1, default=str) + "\n")
    (out / "report.md").write_text(markdown(meta, outcomes, line))


def _finite(x: Any) -> Any:
    """JSON has no NaN: an N/A figure is null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite(v) for v in x]
    return x


def markdown(meta: dict[str, Any], outcomes: list[Outcome], line: str) -> str:
    lines = [
        f"# OpScope GPU check — {meta['mode']} run",
        "",
        f"**{line}**",
        "",
        f"- started {meta['started']}, {meta['seconds']:.0f} s in all (budget {meta['budget_s']:.0f} s)",
        f"- checkout {meta.get('git', '?')}",
        "",
    ]
    lines += _environment(outcomes)
    lines += ["## Checks", "", "| check | result | seconds | why |", "| --- | --- | --- | --- |"]
    lines += [f"| {o.name} | {o.status} | {o.seconds:.1f} | {_cell(o.reason)} |" for o in outcomes]
    lines += ["", "## Figures", ""]
    for o in outcomes:
        if o.figures:
            lines += [f"### {o.name}", "", *_figure_lines(o.figures), ""]
    lines += ["## Commands", ""]
    for o in outcomes:
        lines += [f"- {o.name}: " + "; ".join(f"`{c}`" for c in o.commands)] if o.commands else []
    return "\n".join(lines) + "\n"


def _environment(outcomes: list[Outcome]) -> list[str]:
    env = next((o.figures for o in outcomes if o.name == "environment"), {})
    probe, smi = env.get("probe", {}), env.get("nvidia_smi", {})
    out = ["## Machine", ""]
    for key in ("torch", "torch_cuda", "nccl", "device", "capability", "sms", "memory_bytes", "l2_bytes"):
        if probe.get(key) is not None:
            out.append(f"- {key}: {probe[key]}")
    out += [f"- nvidia-smi {k}: {v}" for k, v in smi.items()]
    q = env.get("nvidia_smi_q") or []
    if q:
        out += ["", "`nvidia-smi -q` (the lines kept):", "", "```", *q, "```"]
    return out + [""]


def _figure_lines(figures: dict[str, Any], depth: int = 0) -> list[str]:
    out = []
    for k, v in figures.items():
        pad = "  " * depth
        if isinstance(v, dict) and v and depth < 2:
            out += [f"{pad}- {k}:", *_figure_lines(v, depth + 1)]
        else:
            out.append(f"{pad}- {k}: {_short(v)}")
    return out


def _short(v: Any) -> str:
    if isinstance(v, float):
        return "N/A" if not math.isfinite(v) else f"{v:.4g}"
    text = json.dumps(_finite(v), default=str) if isinstance(v, (dict, list)) else str(v)
    return text if len(text) <= 400 else text[:400] + " …"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")[:500]
