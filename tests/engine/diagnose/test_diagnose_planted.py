"""Planted cases: each known cause of slowness must come out as the top finding of a real diagnosis,
with the right bound and line. The machine's other processes are read from conftest's quiet fake
/proc, except in the foreign-load case, which reads the real one beside a process it starts.

Small and fast: the embedded model only where it is the point (its batch-1 decode, memory-bound,
with few decode steps: the bound comes from bytes, FLOP, op counts and the ceilings, not from long
timings); placement and the host bound on the tiny model of conftest.py (its decode steps cost
milliseconds), the 512-token prefill on a model of the embedded one's layer shape with two layers.
The leaky-norm diagnosis is taken once and serves both the placement case and the diff."""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import opscope.engine.trace.planted as planted_module
import pytest
from opscope.engine.cli.main import main
from opscope.engine.diagnose.measure import ModelPlan
from opscope.engine.diagnose.report import render_text
from opscope.engine.diagnose.session import diagnose_model

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[3]
SLOW_LOADER = """import time

import torch
from torch import nn

import opscope


def batches(n):
    for i in range(n):
        rows = []
        for _ in range(32):
            time.sleep(0.001)  # LOADER: one sample at a time, in Python
            rows.append([0.1 * (i % 3)] * 16)
        yield torch.tensor(rows)


model = nn.Linear(16, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x in batches(8):
    loss = (model(x) - 1.0).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    opscope.step()
"""


def _line(path: Path, marker: str) -> int:
    return next(i for i, text in enumerate(path.read_text().splitlines(), 1) if marker in text)


# the embedded model's layer shape (SmolLM2-135M), two layers and a smaller vocabulary
PREFILL_SHAPE = dict(
    hidden_size=576,
    intermediate_size=1536,
    num_attention_heads=9,
    num_key_value_heads=3,
    num_hidden_layers=2,
    vocab_size=8192,  # its output head makes decode clearly memory-bound, not host-bound
    max_position_embeddings=1024,
)


@pytest.fixture(scope="module")
def two_layer_lm(tmp_path_factory):
    from opscope.engine.api import load
    from opscope.engine.testing.gguf_writer import hf_config, write_gguf

    path = write_gguf(tmp_path_factory.mktemp("two") / "two.gguf", hf_config("llama", **PREFILL_SHAPE), types="F16")
    return load(path, fastpath="off")


def _cli(capsys, *argv: str) -> tuple[int, list[str]]:
    code = main(list(argv))
    return code, capsys.readouterr().out.splitlines()


def _top(lines: list[str]) -> str:
    return next(line for line in lines if line.startswith("1. "))


def _on_meta(tiny_gguf: Path, db: str) -> list[str]:
    return ["diagnose", "--model", str(tiny_gguf), "--device", "meta", "--trace-tokens", "2", "--db", db]


@pytest.fixture(scope="module")
def leaky(tiny_gguf, tmp_path_factory) -> tuple[str, dict]:
    """`opscope diagnose --device meta --variant leaky-norm --json` on the tiny model, once for the
    module: (the store it saved the run "leaky" in, the diagnosis as printed). Run with user dirs of
    its own, as conftest gives each test."""
    base = tmp_path_factory.mktemp("leaky")
    db, out = str(base / "runs.sqlite"), io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out):
        for var in ("XDG_DATA_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "OPSCOPE_CACHE_DIR"):
            mp.setenv(var, str(base / var.lower()))
        code = main([*_on_meta(tiny_gguf, db), "--variant", "leaky-norm", "--name", "leaky", "--json"])
    printed = out.getvalue()
    assert code == 0, printed
    assert printed.splitlines()[-1].startswith("saved as run 1 (leaky)")
    return db, json.loads(printed[: printed.rindex("saved as run")])


def test_leaky_norm_on_the_meta_stand_in_is_placement_at_the_planted_line(leaky):
    _db, d = leaky
    top = d["findings"][0]
    bug = _line(Path(planted_module.__file__), "BUG: leaves the device")
    assert (top["rule"], top["bound"], top["severity"]) == ("placement", "placement", "high"), d["findings"]
    assert top["place"] == f"layers.*.attn_norm, layers.*.mlp_norm, norm at engine/trace/planted.py:{bug}"
    assert "compute runs on cpu instead of meta" in top["evidence"]
    assert d["headline"].startswith("diagnose tiny.gguf on meta (simulated: placement real, times not): ")
    assert d["headline"].endswith("bound: not timed (simulated device)")


def test_embedded_batch_one_decode_is_memory_bound_and_a_clean_run_has_nothing_above_info(lm_plain):
    # 16 prompt tokens: the prefill pass, which reads the same weights, takes clearly longer than a
    # decode step, so decode is the phase the bandwidth holds most tightly even on a noisy host
    d, run = diagnose_model(
        lm_plain, ModelPlan(prompt_tokens=16, tokens=8, trace_tokens=2), "embedded", telemetry_ms=None
    )
    top = d.findings[0]
    assert (top.rule, top.bound) == ("memory-bound", "memory"), render_text(d)
    assert top.evidence.startswith("decode reads 51") and " MiB per token at " in top.evidence
    assert top.evidence.endswith("probed now (no stored peak: `opscope bench bandwidth`): memory-bound (MBU)")
    module, _, line = top.place.partition(" at ")
    # the largest readers: lm_head (113 MB, tied embedding) or one of the 30-layer patterns (~106 MB each)
    assert (module == "lm_head" or module.startswith("layers.*.")) and line.startswith("engine/models/transformer.py:")
    assert [f.severity for f in d.findings if f.severity != "info"] == [], render_text(d)
    assert run.kind == "diagnosis" and run.trace_summary["findings"][0]["rule"] == "memory-bound"


def test_a_prefill_of_512_tokens_is_compute_bound(two_layer_lm):
    d, _ = diagnose_model(
        two_layer_lm, ModelPlan(prompt_tokens=512, tokens=2, trace_tokens=2), "two-layer", telemetry_ms=None
    )
    top = d.findings[0]
    assert (top.rule, top.bound) == ("compute-bound", "compute"), render_text(d)
    # 2 layers × 512 tokens × 2 FLOP × 3.54 M weights (7.25 G) + causal attention: 2 layers × (QK, AV)
    # × 2 FLOP × 512²/2 × 576 (0.60 G) + the output head for the last token (0.01 G)
    assert top.evidence.startswith("prefill of 512 tokens: 7.86 GFLOP per pass at ")
    assert top.evidence.endswith(
        "of a 1024² matmul probed now (no stored peak: `opscope bench matmul`): compute-bound (MFU)"
    )
    assert " at engine/models/transformer.py:" in top.place


def test_a_tiny_model_whose_ops_are_shorter_than_their_dispatch_is_host_bound(tiny_gguf, tmp_path, capsys):
    code, lines = _cli(
        capsys,
        "diagnose",
        "--model",
        str(tiny_gguf),
        "--tokens",
        "16",
        "--trace-tokens",
        "2",
        "--db",
        str(tmp_path / "runs.sqlite"),
    )
    assert code == 0
    # both phases of a tiny model are host-bound; which ranks first depends on the host's load (seen:
    # prefill first on a busy 2-core machine)
    assert re.match(r"1\. \[medium\] host: (decode|prefill of \d+ tokens) runs ", _top(lines)), "\n".join(lines)
    assert "host-bound" in _top(lines) and "at layers.*" in lines[2] and "engine/models/transformer.py:" in lines[2]
    assert lines[-1].startswith("saved as run 1 (diagnosis-")


def test_a_neighbour_spinning_on_a_core_is_named_and_the_figures_marked_disturbed(tiny_gguf, monkeypatch, capsys):
    monkeypatch.setenv("OPSCOPE_PROC", "/proc")
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)  # let it reach the run queue
        code, lines = _cli(
            capsys,
            "diagnose",
            "--model",
            str(tiny_gguf),
            "--tokens",
            "16",
            "--trace-tokens",
            "2",
            "--no-save",
            "--json",
        )
    finally:
        spin.kill()
        spin.wait()

    d = json.loads("\n".join(lines))
    top = d["findings"][0]
    assert code == 0 and (top["rule"], top["severity"]) == ("foreign-load", "high")
    assert top["evidence"].endswith("during the measurement: every figure here is disturbed")
    assert spin.pid in [n["pid"] for n in d["measurement"]["neighbours"]]
    assert d["disturbed"] and d["headline"].endswith("[figures disturbed]")


def test_slow_train_is_a_per_element_storm_at_its_item_line(tmp_path, capsys):
    script = ROOT / "examples" / "slow_train.py"
    code, lines = _cli(capsys, "diagnose", "--no-save", "--", "python", str(script), "--steps", "12")
    bug = _line(script, "BUG: one .item() per row")
    assert code == 0
    top = _top(lines)
    assert top.startswith("1. [high] host (syncs): ") and "a per-element loop" in top, "\n".join(lines)
    assert lines[lines.index(top) + 1].startswith(f"   at examples/slow_train.py:{bug} · fix: replace the per-element")
    assert any(line.startswith("2. [high] training: the loss passed to backward()") for line in lines)


def test_a_step_that_waits_on_a_slow_python_loader_is_the_input_pipeline(tmp_path, capsys):
    script = tmp_path / "loader.py"
    script.write_text(SLOW_LOADER)
    code, lines = _cli(capsys, "diagnose", "--no-save", "--cwd", str(tmp_path), "--", "python", "loader.py")
    loader = _line(script, "LOADER")
    top = _top(lines)
    assert code == 0 and top.startswith("1. [medium] input pipeline: no op runs for "), "\n".join(lines)
    assert f"while the host runs loader.py:{loader} (" in top
    assert lines[lines.index(top) + 1].startswith(f"   at loader.py:{loader} · fix: prepare batches ahead")


def test_diff_of_two_saved_diagnoses_says_the_placement_finding_went_away(leaky, tiny_gguf, tmp_path, capsys):
    db, _ = leaky
    _, lines = _cli(capsys, *_on_meta(tiny_gguf, db), "--name", "fixed", "--markdown", str(tmp_path / "fixed.md"))
    assert lines[-2] == f"Markdown: {tmp_path / 'fixed.md'}"
    assert (tmp_path / "fixed.md").read_text().startswith("# Diagnosis: tiny.gguf\n")
    code, lines = _cli(capsys, "diagnose", "diff", "leaky", "fixed", "--db", db)
    assert code == 0
    assert lines[:2] == [
        "diagnose diff: A = leaky, B = fixed",
        "bound: not timed (simulated device)  →  not timed (simulated device)",
    ]
    gone = lines.index("gone in B: 2")
    assert lines[gone + 1].startswith(
        "  [high] placement: layers.*.attn_norm, layers.*.mlp_norm, norm: compute runs on cpu"
    )
    assert "new in B: none" in lines


def test_diff_refuses_a_run_that_is_not_a_diagnosis(tmp_path, capsys):
    from opscope.engine.core.results import RunResult
    from opscope.engine.trace.runs import save

    db = str(tmp_path / "runs.sqlite")
    save(RunResult(kind="matmul", name="bench-a"), db)
    capsys.readouterr()
    code = main(["diagnose", "diff", "bench-a", "bench-a", "--db", db])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err == (
        "opscope: error: run bench-a (bench-a) is a matmul run, not a saved diagnosis "
        "(`opscope runs list --kind diagnosis` lists those)"
    )
