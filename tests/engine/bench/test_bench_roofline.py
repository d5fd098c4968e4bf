"""Roofline (issue 14 item 5): points placed by FLOP/byte against compute and bandwidth ceilings.

The figures are worked out by hand from the formulas (2·n³ FLOP over 3·n²·4 bytes for an fp32
matmul, the llm suite's stored work per token), not from the code under test; one llm run is real.
"""

from __future__ import annotations

import json

import pytest
from opscope.engine.bench.ceilings import peaks, roofline
from opscope.engine.cli.main import main
from opscope.engine.core.results import Metric, RunResult
from opscope.engine.store import RunStore

TH = {
    "value": 500e9,
    "source": "test",
    "basis": "theoretical",
    "kind": "matmul",
    "dtype": "float32",
    "label": "theoretical 500 GFLOP/s",
}


def matmul_run(name="mm") -> RunResult:
    metrics = [
        Metric("matmul_float32_256", "GFLOP/s", [100.0, 102.0, 98.0], params={"n": 256, "dtype": "float32"}),
        Metric("matmul_float32_64", "GFLOP/s", [10.0, 10.0, 10.0], params={"n": 64, "dtype": "float32"}),
        Metric("matmul_float32_64.pct_peak", "%", [2.0], params={"n": 64, "dtype": "float32"}),
        Metric("matmul_float32_8192", "GFLOP/s", [], status="failed", error="skipped: too big"),
    ]
    settings = {
        "device": "cpu",
        "dtype": "float32",
        "suite_params": {"peaks": {"float32": {"theoretical": TH, "measured": None}}},
    }
    return RunResult(kind="matmul", name=name, settings=settings, metrics=metrics)


def test_matmul_points_by_hand_with_a_measured_bandwidth_ceiling():
    peaks.record("cpu", "bandwidth", None, 20e9, "test: 20 GB/s")
    roof = roofline.from_run(matmul_run())
    assert [p.name for p in sorted(roof.points, key=lambda p: p.intensity)] == [
        "matmul_float32_64",
        "matmul_float32_256",
    ]
    by = {p.name: p for p in roof.points}
    # 2·256³ / (3·256²·4) = 256/6 FLOP/byte; 100 GFLOP/s achieved
    assert by["matmul_float32_256"].intensity == pytest.approx(256 / 6)
    assert by["matmul_float32_256"].flop_s == pytest.approx(100e9)
    assert by["matmul_float32_64"].intensity == pytest.approx(64 / 6)
    assert roof.ridge == pytest.approx(500e9 / 20e9)  # 25 FLOP/byte
    # n=64 (10.67 FLOP/byte) is below the ridge: memory-bound, roof = 10.67 × 20 GB/s = 213 GFLOP/s
    assert by["matmul_float32_64"].bound == "memory"
    assert by["matmul_float32_64"].attainable == pytest.approx(64 / 6 * 20e9)
    assert by["matmul_float32_64"].pct_of_roof == pytest.approx(10e9 / (64 / 6 * 20e9) * 100)
    assert by["matmul_float32_256"].bound == "compute"
    assert by["matmul_float32_256"].pct_of_roof == pytest.approx(20.0)
    kinds = {(c.kind, c.basis, c.origin) for c in roof.ceilings}
    assert kinds == {("compute", "theoretical", "stored with the run"), ("bandwidth", "measured", "this machine now")}
    assert not roof.notes


def test_a_roofline_sent_as_json_comes_back_whole():
    """The engine worker computes a roofline and the GUI draws it: as_dict → JSON → from_dict."""
    peaks.record("cpu", "bandwidth", None, 20e9, "test: 20 GB/s")
    roof = roofline.from_run(matmul_run())
    back = roofline.Roofline.from_dict(json.loads(json.dumps(roof.as_dict())))
    assert back == roof and back.ridge == pytest.approx(500e9 / 20e9)
    assert roofline.svg(back) == roofline.svg(roof)


def test_a_missing_ceiling_is_said_with_the_way_to_get_one(monkeypatch):
    monkeypatch.setattr(peaks, "theoretical", lambda *a, **k: None)
    roof = roofline.from_run(matmul_run())
    assert len(roof.points) == 2 and all(p.attainable is None and p.bound is None for p in roof.points)
    assert any("no bandwidth ceiling" in n and "opscope bench bandwidth" in n for n in roof.notes)


def test_attention_points_from_the_run_settings():
    m = Metric("attn_sdpa_128", "ms", [2.0, 2.0, 2.0], higher_is_better=False, params={"variant": "sdpa", "seq": 128})
    run = RunResult(
        kind="attention",
        name="at",
        metrics=[m],
        settings={"device": "cpu", "dtype": "float32", "suite_params": {"batch": 1, "heads": 4, "head_dim": 64}},
    )
    (pt,) = roofline.from_run(run).points
    flop, nbytes = 2.0 * 4 * 128 * 128 * 64, 4.0 * 4 * 128 * 64 * 4
    assert pt.intensity == pytest.approx(flop / nbytes) and pt.flop_s == pytest.approx(flop / 2e-3)


def test_other_run_kinds_are_refused_in_one_line():
    from opscope.engine.core.errors import ConfigError

    with pytest.raises(ConfigError, match="a roofline places llm, matmul, attention points"):
        roofline.from_run(RunResult(kind="kv_cache", name="kv"))


def test_cli_text_json_and_svg(tmp_path, capsys):
    peaks.record("cpu", "bandwidth", None, 20e9, "test")
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    with RunStore.open(db) as store:
        store.save(matmul_run("mm"))
    assert main(["--db", db, "runs", "roofline", "mm"]) == 0
    out = capsys.readouterr().out
    assert "ridge point: 25.00 FLOP/byte" in out and "compute ceiling: theoretical 500.0 GFLOP/s" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("matmul_float32_64 "))
    assert "memory" in line and "10.7" in line
    assert main(["--db", db, "runs", "roofline", "mm", "--format", "json", "--out", str(tmp_path / "r.svg")]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ridge_flop_per_byte"] == pytest.approx(25.0) and len(doc["points"]) == 2
    svg = (tmp_path / "r.svg").read_text()
    assert (
        svg.startswith("<svg") and svg.count("<circle") == 2 and svg.count("<polyline") == 1
    )  # one compute × one bandwidth roof
    assert main(["--db", db, "runs", "roofline", "mm", "--out", str(tmp_path / "r.txt")]) == 2
    assert ".svg or .png" in capsys.readouterr().err


def test_out_without_an_extension_draws_what_the_help_says(tmp_path, capsys):
    import importlib.util

    peaks.record("cpu", "bandwidth", None, 20e9, "test")
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    with RunStore.open(db) as store:
        store.save(matmul_run("mm"))
    with pytest.raises(SystemExit):
        main(["runs", "roofline", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "a name without an extension writes FILE.svg and, where matplotlib is installed, FILE.png" in help_text
    assert main(["--db", db, "runs", "roofline", "mm", "--out", str(tmp_path / "roof")]) == 0
    assert (tmp_path / "roof.svg").read_text().startswith("<svg")
    err = capsys.readouterr().err.splitlines()
    assert err[0] == f"wrote {tmp_path / 'roof.svg'}"
    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "roof.png").read_bytes()[:4] == b"\x89PNG" and err[1:] == [f"wrote {tmp_path / 'roof.png'}"]
    else:
        assert err[1:] == [f"{tmp_path / 'roof'}.png not written: PNG needs matplotlib (pip install matplotlib)"]


@pytest.mark.usefixtures("one_torch_thread")
def test_a_real_llm_run_places_pp_and_tg_by_their_stored_work(tmp_path, capsys, lm):
    from opscope.engine.bench.measure.options import BenchOptions
    from opscope.engine.bench.session import run_suite
    from opscope.engine.bench.suites import get_suite

    llm = get_suite("llm")
    params = llm.Params(pp=16, tg=4, depths=(0,), gen_prompt=8, gen_tokens=2)
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    with RunStore.open(db) as store:
        run_suite("llm", BenchOptions(quick=True, threads=1), store, name="l", params=params, model=lm)
        result = store.load("l").result
    work = result.settings["suite_params"]["roofline"]
    cfg = lm.config
    # tg: the weights are read for every token, pp: once for all 16, so pp's intensity is far higher
    assert work["pp16"]["bytes"] < work["tg4"]["bytes"] / 8
    assert work["tg4"]["flop"] == pytest.approx(sum(llm.M.forward_flops(cfg, 1, i, 1) for i in range(4)) / 4)
    roof = roofline.from_run(result)
    by = {p.name: p for p in roof.points}
    assert set(by) == {"pp16", "tg4"}
    tg = next(m for m in result.metrics if m.name == "tg4")
    import statistics

    assert by["tg4"].flop_s == pytest.approx(statistics.median(tg.samples) * work["tg4"]["flop"])
    assert by["pp16"].intensity > by["tg4"].intensity
