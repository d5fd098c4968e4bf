"""`trace diff` judges the median step as `runs compare` judges a metric (issue 31 item 4): a change
within the noise is "~", too few steps say so, and noisy step times are flagged."""

from __future__ import annotations

import numpy as np
import pytest
from opscope.engine.cli.main import main
from opscope.engine.core.results import RunResult
from opscope.engine.store import RunStore


def _summary(step_ms: list[float]) -> dict:
    return {
        "version": 1,
        "unit": "step",
        "script": "train.py",
        "argv": [],
        "target": "cpu",
        "step_source": "marked",
        "steps": len(step_ms),
        "step_ms": step_ms,
        "median_step_ms": float(np.median(step_ms)),
        "wall_ms": sum(step_ms),
        "exit_code": 0,
        "error": None,
        "ops": 100,
        "ops_on_target": 100,
        "ops_off_target": 0,
        "ops_per_step": 10.0,
        "ops_on_target_pct": 100.0,
        "transfers_per_step": {},
        "syncs_per_step": 0.0,
        "syncs": 0,
        "findings": [],
        "modules": {},
        "losses": [],
        "roots": [],
    }


def _diff(tmp_path, capsys, a: list[float], b: list[float]) -> list[str]:
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    with RunStore.open(db) as store:
        for name, steps in (("a", a), ("b", b)):
            store.save(RunResult(kind="trace", name=name, trace_summary=_summary(steps)))
    capsys.readouterr()
    assert main(["--db", db, "trace", "diff", "a", "b"]) == 0
    out = capsys.readouterr().out.splitlines()
    at = next(i for i, ln in enumerate(out) if ln.strip().startswith("median step (ms)"))
    return out[at + 1 : at + 3]


def _iqr_pct(x) -> float:
    p25, p75 = np.percentile(x, [25, 75])
    return (p75 - p25) / np.median(x) * 100


def test_a_change_inside_the_noise_is_no_change_and_the_noise_is_named(tmp_path, capsys):
    a = list(np.linspace(35.0, 175.0, 20))  # median 105, IQR 67 % of it
    b = [v * 1.05 for v in a]
    lines = _diff(tmp_path, capsys, a, b)
    assert lines[0].startswith("    verdict: ~ (p=") and lines[0].endswith(
        " n=20+20): no significant difference (p > 0.05)"
    )
    assert lines[1] == (
        f"    noisy: step-time IQR/median A {_iqr_pct(a):.0f}%, B {_iqr_pct(b):.0f}% (over 10%): "
        f"rerun on a quieter machine or with more steps"
    )
    assert f"{_iqr_pct(a):.0f}" == "67"


def test_a_clear_change_is_significant(tmp_path, capsys):
    a = [100.0 + 0.01 * i for i in range(20)]
    b = [v * 1.1 for v in a]
    lines = _diff(tmp_path, capsys, a, b)
    assert lines[0] == "    verdict: +10.00% (p=0.000 n=20+20): B is slower"
    assert not lines[1].startswith("    noisy")


@pytest.mark.parametrize("n", [2, 3])
def test_too_few_steps_cannot_decide(tmp_path, capsys, n):
    lines = _diff(tmp_path, capsys, [100.0, 101.0, 102.0][:n], [120.0, 121.0, 122.0][:n])
    assert lines[0].startswith("    verdict: +") and lines[0].endswith(
        f"? n too small to decide (need ≥ 4 steps per side, n={n}+{n})"
    )
