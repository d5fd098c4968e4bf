"""`opscope runs compare`'s notes: peaks compared by value, footnote legend in the marks' order."""

from __future__ import annotations

from opscope.engine.cli.main import main
from opscope.engine.core.results import Metric, RunResult
from opscope.engine.store import RunStore


def _run(name: str, dtype: str, peak_value: float) -> RunResult:
    params = {"peak": f"{peak_value:g} {dtype}", "peak_value": peak_value, "peak_basis": "spec", "peak_unit": "GFLOP/s"}
    # three samples (¹ few), spread over 4x (² noisy), measured under load (³ disturbed)
    return RunResult(
        kind="matmul",
        name=name,
        settings={"dtype": dtype},
        metrics=[Metric("mfu", "%", [10.0, 20.0, 40.0], params=params, quality="disturbed")],
    )


def _compare(tmp_path, *runs: RunResult, capsys) -> str:
    db = tmp_path / "runs.sqlite"
    with RunStore.open(db) as store:
        for run in runs:
            store.save(run)
    capsys.readouterr()
    assert main(["--db", str(db), "runs", "compare", *(r.name for r in runs)]) == 0
    return capsys.readouterr().out


def test_same_peak_under_two_labels_is_not_a_different_peak(tmp_path, capsys):
    out = _compare(tmp_path, _run("f32", "float32", 588.8), _run("bf16", "bfloat16", 588.8), capsys=capsys)
    assert "different peaks" not in out, out  # before: "(588.8 float32 / 588.8 bfloat16)"


def test_different_peak_values_are_said_and_the_legend_reads_in_order(tmp_path, capsys):
    out = _compare(tmp_path, _run("f32", "float32", 588.8), _run("bf16", "bfloat16", 1177.6), capsys=capsys)
    assert "different peaks (588.8 float32 / 1177.6 bfloat16)" in out, out
    legend = [line.lstrip()[0] for line in out.splitlines() if line.lstrip()[:1] in ("¹", "²", "³")]
    assert legend == ["¹", "²", "³"], out  # before: ¹ ³ ²
