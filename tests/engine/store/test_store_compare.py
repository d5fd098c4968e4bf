"""Comparison of runs saved to a real SQLite file, through the API and the `opscope runs` CLI."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys

import numpy as np
import pytest
from opscope.engine.cli.main import main
from opscope.engine.core.results import Metric, RunResult
from opscope.engine.store import RunStore
from opscope.engine.store.compare import compare
from opscope.engine.store.render import render
from scipy import stats as sps

N = 12


def llm_run(name: str, dtype: str, speedup: float, seed: int, n: int = N) -> RunResult:
    """Seeded samples shaped like the llm suite's: bf16 speeds pp/tg up, ITL unchanged."""
    rng = np.random.default_rng(seed)
    return RunResult(
        kind="llm",
        name=name,
        tags=["test"],
        settings={"dtype": dtype, "threads": 2, "model": "SmolLM2-135M"},
        fingerprint={"cpu": {"model": "AMD EPYC", "cores": 2}, "torch": "2.13.0", "git": "abc123"},
        metrics=[
            Metric("pp512", "tok/s", list(rng.normal(800 * speedup, 8, n))),
            Metric("tg128", "tok/s", list(rng.normal(21 * speedup, 0.3, n))),
            Metric("ttft", "ms", list(rng.normal(640 / speedup, 4, n)), higher_is_better=False),
            Metric("itl_p95", "ms", list(rng.normal(48, 0.5, 5)), higher_is_better=False),
            Metric("tg4096", "tok/s", [], status="failed", error="out of memory"),
        ],
    )


@pytest.fixture
def saved(tmp_path):
    """(db path, baseline run, bf16 run) saved to a real file."""
    path = tmp_path / "runs.sqlite"
    base, bf16 = llm_run("llm-f32", "float32", 1.0, 1), llm_run("llm-bf16", "bfloat16", 1.5, 2)
    with RunStore.open(path) as store:
        store.save(base)
        store.save(bf16)
    return path, base, bf16


def cli(path, *args: str) -> int:
    return main(["--db", str(path), "runs", *args])


def _row(doc: dict, name: str) -> dict:
    return next(r for s in doc["sections"] for r in s["rows"] if r["name"] == name)


def test_compare_json_matches_scipy_on_the_saved_samples(saved, capsys):
    path, base, bf16 = saved
    assert cli(path, "compare", "llm-f32", "llm-bf16", "--format", "json") == 0
    doc = json.loads(capsys.readouterr().out)
    pp = _row(doc, "pp512")
    a, b = base.metrics[0].samples, bf16.metrics[0].samples
    assert pp["deltas"][0]["delta_pct"] == pytest.approx((np.median(b) / np.median(a) - 1) * 100)
    assert pp["deltas"][0]["p_value"] == pytest.approx(sps.mannwhitneyu(a, b, alternative="two-sided").pvalue)
    assert pp["deltas"][0]["significant"] and not pp["deltas"][0]["worse"]
    ttft = _row(doc, "ttft")["deltas"][0]
    assert ttft["delta_pct"] < 0 and ttft["significant"] and not ttft["worse"]  # lower is better
    assert _row(doc, "tg4096")["cells"][0]["status"] == "failed"
    assert _row(doc, "itl_p95")["cells"][0]["few_samples"]
    assert doc["differences"] == [{"field": "settings.dtype", "values": ["float32", "bfloat16"]}]
    tok_s = next(s for s in doc["sections"] if s["unit"] == "tok/s")
    ratio = np.sqrt(
        (np.median(bf16.metrics[0].samples) * np.median(bf16.metrics[1].samples))
        / (np.median(a) * np.median(base.metrics[1].samples))
    )
    assert tok_s["geomean_deltas_pct"][0] == pytest.approx((ratio - 1) * 100)


def test_text_table_reads_like_benchstat(saved, capsys):
    path, _, _ = saved
    assert cli(path, "compare", "1", "llm-bf16") == 0
    out = capsys.readouterr().out
    assert "settings.dtype  float32  bfloat16" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("pp512 "))
    assert re.search(r"^pp512 +802\.8 ± \d\.\d% +1,200 ± \d\.\d% +\+49\.\d\d% \(p=0\.000 n=12\+12\)$", line), line
    itl = next(ln for ln in out.splitlines() if ln.startswith("itl_p95"))
    assert "~ (p=" in itl and "¹" in itl  # no significant change; fewer than 10 samples
    assert next(ln for ln in out.splitlines() if ln.startswith("tg4096")).split()[1] == "failed"
    assert any(ln.startswith("geomean") for ln in out.splitlines())
    assert "¹ fewer than 10 samples" in out


def test_markdown_and_csv_formats(saved, capsys):
    path, _, _ = saved
    assert cli(path, "compare", "llm-f32", "llm-bf16", "--format", "markdown") == 0
    md = capsys.readouterr().out
    assert "| tok/s (higher is better) | llm-f32 | llm-bf16 | vs llm-f32 |" in md
    assert cli(path, "compare", "llm-f32", "llm-bf16", "--format", "csv") == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(rows) == 2 * 5 and {r["run_name"] for r in rows} == {"llm-f32", "llm-bf16"}
    assert next(r for r in rows if r["metric"] == "pp512" and r["run_name"] == "llm-bf16")["significant"] == "True"


def test_no_runs_given_compares_the_two_latest_of_the_same_kind(saved, capsys):
    path, _, _ = saved
    assert cli(path, "compare", "--format", "json") == 0  # oldest first: it is the baseline
    assert [r["name"] for r in json.loads(capsys.readouterr().out)["runs"]] == ["llm-f32", "llm-bf16"]
    with RunStore.open(path) as store:
        store.save(RunResult(kind="matmul", name="lonely", status="completed"))
    assert cli(path, "compare") == 2  # the latest run has nothing of its kind to compare with
    assert "only one completed 'matmul' run" in capsys.readouterr().err


def test_fail_on_regression_gates_only_significant_changes_beyond_the_threshold(saved, capsys):
    path, _, _ = saved
    assert cli(path, "compare", "llm-f32", "llm-bf16", "--fail-on-regression", "5") == 0  # bf16 is faster
    assert cli(path, "compare", "llm-bf16", "llm-f32", "--fail-on-regression", "5") == 1  # reversed: slower
    err = capsys.readouterr().err
    assert "regression: pp512 in 'llm-f32': -33" in err and "regression: ttft" in err
    assert cli(path, "compare", "llm-bf16", "llm-f32", "--fail-on-regression", "60") == 0  # all below 60%


def test_same_run_twice_shows_no_significant_change(saved):
    path, _, _ = saved
    with RunStore.open(path) as store:
        cmp = compare([store.load("llm-f32"), store.load("llm-f32")])
    deltas = [d for s in cmp.sections for r in s.rows for d in r.deltas if d is not None]
    assert deltas and all(not d.significant and d.delta_pct == 0 for d in deltas)
    assert cmp.regressions(0) == [] and cmp.differences == ()
    assert "settings and fingerprint: identical" in render(cmp)


def test_three_runs_each_compare_to_the_first(saved, capsys):
    path, _, _ = saved
    with RunStore.open(path) as store:
        store.save(llm_run("llm-bf16-again", "bfloat16", 1.5, 3))
    assert cli(path, "compare", "llm-f32", "llm-bf16", "llm-bf16-again", "--format", "json") == 0
    pp = _row(json.loads(capsys.readouterr().out), "pp512")
    assert len(pp["cells"]) == 3 and len(pp["deltas"]) == 2
    assert all(d["delta_pct"] == pytest.approx(50, abs=3) for d in pp["deltas"])


def test_list_show_tag_rename_export_delete(saved, capsys, tmp_path):
    path, _, bf16 = saved
    assert cli(path, "list") == 0
    assert [ln.split()[1] for ln in capsys.readouterr().out.splitlines()[1:]] == ["llm-bf16", "llm-f32"]
    assert cli(path, "show", "llm-bf16") == 0
    out = capsys.readouterr().out
    assert "pp512" in out and "failed: out of memory" in out and "dtype: bfloat16" in out
    assert cli(path, "tag", "llm-bf16", "keep") == 0 and cli(path, "rename", "llm-bf16", "bf16-best") == 0
    capsys.readouterr()
    assert cli(path, "list", "--tag", "keep", "--format", "json") == 0
    assert [r["name"] for r in json.loads(capsys.readouterr().out)] == ["bf16-best"]
    assert cli(path, "export", "bf16-best", "-o", str(tmp_path / "r.json")) == 0
    exported = json.loads((tmp_path / "r.json").read_text())
    assert exported["metrics"][0]["samples"] == bf16.metrics[0].samples and exported["format"] == "opscope-run/1"
    assert cli(path, "export", "bf16-best", "--format", "csv") == 0
    assert len(capsys.readouterr().out.splitlines()) == 1 + 3 * N + 5 + 1  # header, samples, failed row
    assert cli(path, "delete", "bf16-best") == 0
    assert cli(path, "show", "bf16-best") == 2


def test_user_errors_exit_2_with_one_line(saved, capsys):
    path, _, _ = saved
    assert cli(path, "compare", "llm-f32") == 2
    assert "two or more runs" in capsys.readouterr().err
    assert cli(path, "rename", "llm-f32", "llm-bf16") == 2
    assert "already exists" in capsys.readouterr().err
    assert cli(path, "delete", "llm-f32", "nope") == 2  # nothing deleted when one ref is wrong
    capsys.readouterr()
    assert cli(path, "show", "llm-f32") == 0


@pytest.mark.slow  # a fresh interpreter importing the whole CLI: ~2 s here
def test_cli_unknown_run_prints_one_clear_line_and_exits_2(saved):
    path, _, _ = saved
    proc = subprocess.run(
        [sys.executable, "-m", "opscope.engine.cli.main", "--db", str(path), "runs", "show", "no-such-run"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "no saved run named 'no-such-run'" in lines[0] and "opscope runs list" in lines[0]


def test_long_names_become_ids_and_embedded_settings_are_not_repeated(tmp_path, capsys):
    path = tmp_path / "runs.sqlite"
    with RunStore.open(path) as store:
        for name, threads in (("bandwidth-20261121-050848", 2), ("bandwidth-20261121-050857", 1)):
            run = llm_run(name, "float32", 1.0, threads)
            run.settings["threads"] = threads
            run.fingerprint["settings"] = dict(run.settings)  # as engine.bench.fingerprint records it
            store.save(run)
    assert cli(path, "compare", "1", "2") == 0
    out = capsys.readouterr().out
    assert "#1 bandwidth-20261121-050848: llm, completed" in out  # the legend names each column
    assert re.search(r"^what differs +#1 +#2$", out, re.M)
    assert re.search(r"^settings\.threads +2 +1$", out, re.M)
    assert "fingerprint.settings.threads" not in out


def _small_run(
    name: str, scale: float, n: int, peak: str = "theoretical 294.4 GFLOP/s float32", peak_value: float = 2.944e11
) -> RunResult:
    """A run of n samples per metric: a rate, peak memory under its old name, and a utilisation."""
    rates = [100.0 * scale + i for i in range(n)]
    return RunResult(
        kind="llm",
        name=name,
        settings={"threads": 2},
        metrics=[
            Metric("tg16", "tok/s", rates),
            Metric(
                "tg16.peak_mem" if name.endswith("old") else "tg16.peak_mem_bytes",
                "bytes",
                [7.164e8 + i for i in range(n)],
                higher_is_better=False,
            ),
            Metric(
                "tg16.mfu",
                "%",
                [r / 10 for r in rates],
                params={"peak": peak, "peak_value": peak_value, "peak_basis": "theoretical"},
            ),
        ],
    )


def test_three_samples_per_side_say_n_too_small_instead_of_no_change(tmp_path, capsys):
    path = tmp_path / "runs.sqlite"
    with RunStore.open(path) as store:
        store.save(_small_run("fast", 1.0, 3))
        store.save(_small_run("slow", 0.2, 3))  # 5x slower, perfectly separated: p = 0.1 anyway
    assert cli(path, "compare", "fast", "slow") == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("tg16 "))
    assert "-79.21%? n too small to decide (need ≥ 4 per side, n=3+3)" in line and "~" not in line
    assert cli(path, "compare", "fast", "slow", "--format", "json") == 0
    d = _row(json.loads(capsys.readouterr().out), "tg16")["deltas"][0]
    assert (d["decidable"], d["significant"], d["need_per_side"]) == (False, False, 4)
    assert (
        d["p_value"]
        == pytest.approx(sps.mannwhitneyu([100, 101, 102], [20, 21, 22], alternative="two-sided").pvalue)
        == pytest.approx(0.1)
    )
    assert cli(path, "compare", "fast", "slow", "--fail-on-regression", "10") == 3
    assert "undecided: tg16 in 'slow': -79.21%" in capsys.readouterr().err
    assert cli(path, "compare", "slow", "fast", "--fail-on-regression", "10") == 0  # faster: nothing to gate


def test_bytes_read_in_binary_units_and_old_peak_mem_names_still_match(tmp_path, capsys):
    path = tmp_path / "runs.sqlite"
    with RunStore.open(path) as store:
        store.save(_small_run("run-old", 1.0, 6))
        store.save(_small_run("run-new", 1.0, 6))
    assert cli(path, "compare", "run-old", "run-new") == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("tg16.peak_mem_bytes"))
    assert line.count("683.2 MiB") == 2 and "e+08" not in out
    assert cli(path, "show", "run-new") == 0
    show = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("tg16.peak_mem_bytes"))
    assert re.search(r"tg16\.peak_mem_bytes +MiB +6 +683\.2", show), show


def test_utilisation_rows_name_their_peak_and_never_show_above_100(tmp_path, capsys):
    path = tmp_path / "runs.sqlite"
    with RunStore.open(path) as store:
        store.save(_small_run("a", 1.0, 6))
        store.save(_small_run("b", 1.0, 6, peak="measured 187.0 GFLOP/s float32 (2026-11-20)", peak_value=1.87e11))
        store.save(_small_run("c", 11.0, 6))  # 1100+ tok/s: "110%" of the peak
    assert cli(path, "compare", "a", "b", "c") == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("tg16.mfu"))
    assert line.startswith("tg16.mfu (of theoretical 294.4 GFLOP/s float32)")
    assert line.split()[-1] == "invalid"  # run c's 110%, never printed
    assert not re.search(r"\b11\d\.\d", line)
    assert "warning: tg16.mfu: the runs divide by different peaks" in out


def test_differing_byte_settings_read_in_binary_units(tmp_path):
    a, b = llm_run("a", "float32", 1.0, 1), llm_run("b", "float32", 1.0, 2)
    a.settings["model_memory"] = {"rss_bytes": 407572480}
    b.settings["model_memory"] = {"rss_bytes": 962502656}
    a.settings["weights_bytes_per_decode_step"], b.settings["weights_bytes_per_decode_step"] = 96576768, 538060032
    with RunStore.open(tmp_path / "runs.sqlite") as store:
        store.save(a)
        store.save(b)
        text = render(compare([store.load("a"), store.load("b")]), "text")
    assert re.search(r"^settings\.model_memory\.rss_bytes +388\.7 MiB +917\.9 MiB$", text, re.M), text
    assert re.search(r"^settings\.weights_bytes_per_decode_step +92\.10 MiB +513\.1 MiB$", text, re.M), text
