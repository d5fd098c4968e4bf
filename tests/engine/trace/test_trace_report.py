"""Placement reports on a tiny engine Transformer (random weights), on the CPU and on the meta
stand-in for an accelerator: clean runs come out clean; each planted bug is named by module and
by its line in engine/trace/planted.py; engine-loop mistakes beyond the needed I/O are findings."""

from __future__ import annotations

import json
from pathlib import Path

import opscope.engine.trace.planted as planted_module
import pytest
import torch
from opscope.engine.models.config import ModelConfig
from opscope.engine.models.transformer import Transformer
from opscope.engine.trace.capture import Tracer
from opscope.engine.trace.events import D2H, FALLBACK, H2D, TRANSFER, TraceOptions
from opscope.engine.trace.findings import STORM
from opscope.engine.trace.render import render_text
from opscope.engine.trace.report import build_report
from opscope.engine.trace.session import trace_model
from opscope.engine.trace.simulate import simulated_device, to_device_stand_in
from opscope.engine.trace.variants import CLEAN, LEAKY_NORM, PER_ELEMENT_COPY, plant

TINY = ModelConfig(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=64, vocab_size=96, max_seq_len=64)
IDS, TOKENS = [1, 5, 7], 4
PLANTED = Path(planted_module.__file__)


def _bug_line(marker: str) -> str:
    lines = PLANTED.read_text().splitlines()
    n = next(i for i, line in enumerate(lines, 1) if marker in line)
    return f"engine/trace/planted.py:{n}"


@pytest.fixture(scope="module")
def tiny():
    return Transformer.random(TINY)


def _report(model, target, variant=CLEAN, **opts):
    run = trace_model(
        model, IDS, TOKENS, TraceOptions(target=target, **opts), variant=variant, simulate=target == "meta"
    )
    return build_report(run.result, run.notes)


@pytest.mark.parametrize("target", ["cpu", "meta"])
def test_clean_model_is_clean(tiny, target):
    report = _report(tiny, target)
    assert report.clean, render_text(report)
    assert report.by_kind.get(FALLBACK) is None
    assert report.syncs_per_token == 1  # the sampled id, read once per step
    if target == "meta":  # per decode step: the sampled id comes back; nothing goes up (it stays on device)
        per_token = {t.direction: t.per_token_count for t in report.transfers}
        assert per_token == {H2D: 0, D2H: 1}
        assert any(line.startswith("input id H2D") for line in report.expected)
    assert "Findings: none" in render_text(report)


def test_leaky_norm_named_by_module_and_line(tiny):
    report = _report(tiny, "meta", LEAKY_NORM)
    assert len(report.findings) == 1, render_text(report)
    f = report.findings[0]
    assert f.kind == FALLBACK and f.severity == "high"
    assert set(f.modules) == {"layers.*.attn_norm", "layers.*.mlp_norm", "norm"}
    assert _bug_line("BUG: computes on the host") in f.title
    assert set(f.sources) == {
        _bug_line("BUG: leaves the device"),
        _bug_line("BUG: computes on the host"),
        _bug_line("BUG: and copies back"),
    }
    norms = 2 * TINY.n_layers + 1
    assert f.evidence["transfers_per_token"] == {D2H: norms, H2D: norms}
    assert f.evidence["bytes_per_token"] == 2 * norms * TINY.dim * 4  # one float32 row each way
    assert _bug_line("BUG: leaves the device") in f.fix
    text = render_text(report)
    assert "[fallback, high]" in text and "fix:" in text


def test_leaky_norm_is_invisible_on_a_host_target_but_same_numbers(tiny):
    # On the CPU the round trip is a no-op: nothing to find, and the outputs are the clean ones.
    x = torch.tensor([IDS])
    tiny.drop_cache()
    with torch.inference_mode():
        clean = tiny(x, 0)
        with plant(tiny, LEAKY_NORM):
            leaky = tiny(x, 0)
    torch.testing.assert_close(leaky, clean, rtol=1e-5, atol=1e-5)
    assert _report(tiny, "cpu", LEAKY_NORM).clean


@pytest.mark.parametrize("target", ["cpu", "meta"])
def test_per_element_copy_is_a_storm_named_by_module_and_line(tiny, target):
    report = _report(tiny, target, PER_ELEMENT_COPY)
    storms = [f for f in report.findings if f.kind == STORM]
    assert len(storms) == 1 and len(report.findings) == 1, render_text(report)
    storm = storms[0]
    assert storm.modules == ("norm",) and storm.sources == (_bug_line("BUG: per-element copy"),)
    assert storm.evidence["max_per_step"] == TINY.dim
    assert storm.evidence["count_per_token"] == TINY.dim
    assert "per-element" in storm.title and "copy_" in storm.fix


def test_variant_swaps_are_restored(tiny):
    before = [(name, type(m)) for name, m in tiny.named_modules()]
    with plant(tiny, PER_ELEMENT_COPY) as swapped:
        assert swapped == ["norm"]
        assert type(tiny.norm).__name__ == "PerElementCopy"
    assert [(name, type(m)) for name, m in tiny.named_modules()] == before


def _trace_loop(step_fn, tokens=TOKENS):
    """Drive a hand-written decode loop on the meta stand-in of the tiny model."""
    model = to_device_stand_in(Transformer.random(TINY), "meta")
    with simulated_device():
        tracer = Tracer(TraceOptions(target="meta"), model=model)
        with tracer:
            model.setup_cache(1, 32)
            x = torch.tensor([IDS]).to("meta")
            with torch.inference_mode():
                logits = model(x, 0, last_only=True)
                for i in range(tokens):
                    nxt = step_fn(logits)
                    tracer.mark_token()
                    logits = model(nxt.view(1, 1), len(IDS) + i)
    return build_report(tracer.result())


def test_sampling_on_the_host_is_found():
    def host_sampling(logits):  # logits come to the host every step, then argmax runs there
        token = logits[:, -1].cpu().argmax(dim=-1)
        return token.to("meta")

    report = _trace_loop(host_sampling)
    kinds = {(f.kind, f.modules) for f in report.findings}
    assert (FALLBACK, ("",)) in kinds, render_text(report)
    finding = next(f for f in report.findings if f.kind == FALLBACK)
    assert "argmax" in finding.title and finding.evidence["transfers_per_token"][D2H] == 1
    assert finding.evidence["bytes_per_token"] >= TINY.vocab_size * 4


def test_extra_upload_per_step_is_found():
    def upload_position_too(logits):
        torch.tensor([len(IDS)]).to("meta")  # a per-step position upload the model does not need
        nxt = logits[:, -1].argmax(dim=-1)
        nxt.item()
        return nxt

    report = _trace_loop(upload_position_too)
    extra = [f for f in report.findings if f.kind == TRANSFER]
    assert len(extra) == 1 and extra[0].evidence["transfers_per_token"] == {H2D: 1}, render_text(report)
    assert extra[0].sources[0].startswith("tests/engine/trace/test_trace_report.py:")


def test_report_json_round_trips(tiny):
    report = _report(tiny, "meta", LEAKY_NORM)
    data = json.loads(json.dumps(report.as_dict()))
    assert data["clean"] is False and data["target"] == "meta"
    assert data["findings"][0]["kind"] == FALLBACK
    assert 0 < data["ops_on_target_pct"] < 100


def test_a_fallback_names_only_the_devices_off_the_target():
    """A target "cuda" is every "cuda:N": the first GPU run said "compute runs on cpu, cuda:0
    instead of cuda" (docs/gpu.md)."""
    from collections import Counter

    from opscope.engine.trace.aggregate import Group
    from opscope.engine.trace.findings import _merged_finding

    group = Group(
        FALLBACK, "", "", "train.py:19", count=3, ops=Counter({"aten.add.Tensor": 3}), steps=Counter({1: 1, 2: 1, 3: 1})
    )
    group.devices.update({"cpu": 3, "cuda:0": 3})
    title = _merged_finding([group], "cuda", 4, "step").title
    assert "compute runs on cpu instead of cuda at train.py:19 (add)" in title, title
    assert "compute runs on cpu, cuda:0 instead of cuda:1" in _merged_finding([group], "cuda:1", 4, "step").title
