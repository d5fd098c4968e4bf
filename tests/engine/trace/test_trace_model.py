"""The real default model (SmolLM2-135M, shared session fixture) traced through the engine's own
generation loop on the CPU, and as a stand-in on the meta device; both planted bugs named by
module and source line; and the `opscope trace` command end to end."""

from __future__ import annotations

import json
from pathlib import Path

import opscope.engine.trace.planted as planted_module
import pytest
from opscope.engine.cli.main import main
from opscope.engine.generation.events import Finished
from opscope.engine.generation.generate import GenerationConfig
from opscope.engine.trace.events import D2H, FALLBACK, H2D, TraceOptions
from opscope.engine.trace.findings import STORM
from opscope.engine.trace.render import render_text
from opscope.engine.trace.report import build_report
from opscope.engine.trace.session import trace_generation
from opscope.engine.trace.variants import CLEAN, LEAKY_NORM, PER_ELEMENT_COPY

pytestmark = pytest.mark.slow
CONFIG = GenerationConfig(max_tokens=3, ignore_eos=True)
DIM = 576  # SmolLM2-135M's model width


def _bug_line(marker: str) -> str:
    lines = Path(planted_module.__file__).read_text().splitlines()
    return f"engine/trace/planted.py:{next(i for i, line in enumerate(lines, 1) if marker in line)}"


def _report(lm, target: str, variant: str = CLEAN, config: GenerationConfig = CONFIG):
    run = trace_generation(
        lm, "The capital of France is", config, TraceOptions(target=target), variant=variant, simulate=target == "meta"
    )
    return run, build_report(run.result, run.notes)


def test_clean_model_on_cpu_through_the_engine_loop(lm):
    run, report = _report(lm, "cpu")
    assert isinstance(run.finished, Finished) and run.result.tokens == 3
    assert report.clean, render_text(report)
    assert FALLBACK not in report.by_kind and not report.transfers
    assert report.syncs_per_token == 1  # engine.generate's one .item() per step
    assert all("engine/generation/generate.py:" in line for line in report.expected)
    assert report.ops_on_target_pct > 99


def test_clean_model_on_the_meta_stand_in(lm):
    _, report = _report(lm, "meta")
    assert report.clean, render_text(report)
    per_token = {t.direction: t.per_token_count for t in report.transfers}
    assert per_token.get(H2D, 0) == 0 and per_token[D2H] == 1  # only the sampled id comes back
    assert report.syncs_per_token == 1
    assert any("simulated accelerator" in n for n in report.notes)


def test_leaky_norm_named_on_the_meta_stand_in(lm):
    _, report = _report(lm, "meta", LEAKY_NORM)
    assert len(report.findings) == 1, render_text(report)
    f = report.findings[0]
    assert f.kind == FALLBACK and f.modules == ("layers.*.attn_norm", "layers.*.mlp_norm", "norm")
    assert _bug_line("BUG: computes on the host") in f.title
    assert f.evidence["modules"] == 61  # 30 blocks × 2 norms + the final norm
    assert f.evidence["transfers_per_token"] == {D2H: 61, H2D: 61}
    assert "layers.*.attn_norm" in render_text(report)


def test_per_element_copy_named_on_cpu(lm):
    _, report = _report(lm, "cpu", PER_ELEMENT_COPY, GenerationConfig(max_tokens=2, ignore_eos=True))
    assert [f.kind for f in report.findings] == [STORM], render_text(report)
    storm = report.findings[0]
    assert storm.modules == ("norm",) and storm.sources == (_bug_line("BUG: per-element copy"),)
    assert storm.evidence["count_per_token"] == DIM
    assert type(lm.model.norm).__name__ == "RMSNorm"  # the shared model is restored


def test_cli_trace_writes_report_and_exports(tmp_path, capsys, default_model_2_layers):
    """The command's report and exports (the model's first 2 layers: the command loads its own)."""
    out, jsonl = tmp_path / "trace.json", tmp_path / "events.jsonl"
    code = main(
        [
            "trace",
            "Hi",
            "--model",
            str(default_model_2_layers),
            "--tokens",
            "2",
            "--device",
            "meta",
            "--variant",
            "leaky-norm",
            "--out",
            str(out),
            "--jsonl",
            str(jsonl),
            "--json",
        ]
    )
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["simulated"] is True and report["variant"] == "leaky-norm" and not report["clean"]
    assert report["findings"][0]["modules"] == ["layers.*.attn_norm", "layers.*.mlp_norm", "norm"]
    trace = json.loads(out.read_text())
    assert {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"} >= {"meta", "cpu"}
    assert json.loads(jsonl.read_text().splitlines()[0])["type"] == "header"


def test_cli_rejects_bad_flags_before_loading(capsys):
    with pytest.raises(SystemExit) as e:  # argparse checks the range (engine.cli_args)
        main(["trace", "Hi", "--tokens", "0"])
    assert e.value.code == 2
    assert "--tokens: 0 is out of range" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:  # an output path is checked while parsing too
        main(["trace", "Hi", "--out", "/nonexistent/dir/t.json"])
    assert e.value.code == 2
    assert capsys.readouterr().err == (
        "opscope: error: argument --out: /nonexistent/dir/t.json: its folder "
        "/nonexistent/dir does not exist: create it first\n"
    )
