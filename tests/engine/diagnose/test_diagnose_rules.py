"""Each diagnosis rule alone, over a Measurement written by hand: when it fires, what it says (the
printed words), and where it ranks. No model, no torch: the rules are pure functions."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from opscope.engine.diagnose.measurement import Issue, Measurement, Neighbour, Phase
from opscope.engine.diagnose.report import Diagnosis, diff, render_markdown, render_text
from opscope.engine.diagnose.rules import (
    RULES,
    bound_line,
    compute_bound,
    data_movement,
    diagnose,
    exact_activations,
    foreign_load,
    host_bound,
    input_pipeline,
    memory_bound,
    placement,
    storm,
    syncs,
    training,
)

GB = 1e9
# A 135M-parameter float32 model on a CPU: decode reads 515 MiB a token, prefill of 512 does 141 GFLOP.
DECODE = Phase(
    "decode",
    31,
    100.0,
    1,
    flop=0.27e9,
    bytes=540e6,
    ops=1285,
    op_ms=90.0,
    top_module="layers.*.mlp.gate_proj",
    top_source="engine/models/transformer.py:147",
)
PREFILL = Phase(
    "prefill",
    1,
    4000.0,
    512,
    flop=141e9,
    bytes=540e6,
    ops=1350,
    op_ms=3950.0,
    top_module="layers.*.mlp",
    top_source="engine/models/transformer.py:148",
)
BASE = Measurement(
    "model.gguf",
    "model",
    "cpu",
    phases=(replace(PREFILL, tokens=32, flop=8.8e9, wall_ms=300.0), DECODE),
    peak_flop_s=60 * GB,
    peak_flop_label="60 GFLOP/s probed now",
    peak_bytes_s=10 * GB,
    peak_bytes_label="10 GB/s probed now",
    dispatch_us=2.5,
    cores=2,
    other_cores=0.0,
)


def test_decode_that_reads_its_weights_is_memory_bound_with_the_ceiling_and_what_you_get():
    f = memory_bound(BASE)
    assert f.severity == "info" and f.bound == "memory"
    assert f.evidence == (
        "decode reads 515 MiB per token at 5.40 GB/s = 54 % of the 10 GB/s probed now: memory-bound (MBU)"
    )
    assert f.place == "layers.*.mlp.gate_proj at engine/models/transformer.py:147"
    assert f.gain == "ceiling ~18.5 token/s, you get 10"
    assert host_bound(BASE) is None
    assert compute_bound(BASE).evidence.startswith("prefill of 32 tokens")  # 16 FLOP/B, past the ridge of 6


def test_a_long_prefill_is_compute_bound_and_ranks_above_decode_when_it_takes_the_time():
    m = replace(BASE, phases=(PREFILL, replace(DECODE, passes=3)))
    f = compute_bound(m)
    assert f.evidence.startswith("prefill of 512 tokens: 141 GFLOP per pass at 35.2 GFLOP/s = 59 % of the 60 GFLOP/s")
    assert f.gain == "ceiling ~218 token/s, you get 128"
    assert [x.rule for x in diagnose(m)] == ["compute-bound", "memory-bound"]
    assert bound_line(m) == "prefill: compute, decode: memory"


def test_ops_much_shorter_than_the_step_make_it_host_bound():
    tiny = Phase(
        "decode",
        31,
        3.0,
        1,
        flop=2e5,
        bytes=150e3,
        ops=96,
        op_ms=0.25,
        top_module="layers.*.attn",
        top_source="engine/models/transformer.py:95",
    )
    m = replace(BASE, phases=(tiny,), dispatch_us=12.0)
    f = host_bound(m)
    assert f.severity == "medium"
    assert f.evidence == (
        "decode runs 96 ops in 3 ms (31 µs each); issuing them costs ≥ 1.15 ms (12 µs per empty "
        "op, measured), their work needs ~0.015 ms: host-bound"
    )
    assert f.place == "layers.*.attn at engine/models/transformer.py:95"
    assert f.gain == "with the ops fused the work alone allows ~6.67e+04 token/s, you get 333"
    assert memory_bound(m) is None
    assert diagnose(m)[0].rule == "host-bound"
    assert host_bound(replace(m, phases=(replace(tiny, bytes=150e6),))) is None  # now reading 150 MB takes longer
    # where the ops come from, by count: one slow embedding op (preempted, say) does not move it there
    busiest = replace(
        tiny,
        top_module="embed",
        top_source="engine/models/transformer.py:346",
        busiest_module="layers.*",
        busiest_source="engine/models/transformer.py:120",
    )
    assert host_bound(replace(m, phases=(busiest,))).place == "layers.* at engine/models/transformer.py:120"


def test_foreign_load_names_the_processes_and_marks_the_figures_disturbed():
    m = replace(BASE, other_cores=0.98, neighbours=(Neighbour(4242, "spin", 0.97),))
    f = foreign_load(m)
    assert f.evidence == (
        "other processes kept 0.98 of 2 cores busy during the measurement: every figure here is disturbed"
    )
    assert f.place == "pid 4242 spin (0.97 cores)"
    assert diagnose(m)[0].rule == "foreign-load"
    assert "[figures disturbed]" in render_text(Diagnosis.of(m)).splitlines()[0]
    assert foreign_load(replace(m, other_cores=0.2)) is None
    assert foreign_load(replace(m, simulated=True)) is None


def test_placement_outranks_everything_and_keeps_the_trace_line():
    leak = Issue(
        "fallback",
        "high",
        "norm: compute runs on cpu instead of cuda at engine/trace/planted.py:33",
        "layers.*.attn_norm",
        "engine/trace/planted.py:32",
        "keep it on cuda",
        122.0,
        40.0,
    )
    m = replace(
        BASE, issues=(leak,), other_cores=0.9, transfers_per_step=120, transfer_bytes_per_step=281_000, traced_steps=4
    )
    found = diagnose(m)
    assert [f.rule for f in found[:3]] == ["placement", "foreign-load", "data-movement"]
    assert found[0].place == "layers.*.attn_norm at engine/trace/planted.py:32"
    assert found[0].gain == (
        "122 off-target ops/copies per token go away, with ~10 ms of host time per token "
        "(traced; the token takes 100 ms)"
    )
    assert placement(BASE) is None and data_movement(BASE) is None


def test_storm_ranks_above_training_health_and_syncs():
    s = Issue(
        "storm",
        "high",
        "64 tiny transfers/syncs in one step at examples/slow_train.py:46",
        "",
        "examples/slow_train.py:46",
        "one tensor op",
        64.0,
    )
    h = Issue("loss", "high", "the loss does not fall", "", "examples/slow_train.py:48", "check the optimizer")
    y = Issue("sync", "medium", "waits", "head", "x.py:3", "keep it", 3.0)
    m = replace(BASE, unit="step", issues=(h, y, s))
    assert [f.rule for f in diagnose(m)[:3]] == ["storm", "training", "syncs"]
    assert storm(m).place == "examples/slow_train.py:46" and storm(m).bound == "host (syncs)"
    assert training(m).evidence == "the loss does not fall" and syncs(m).severity == "medium"


def test_a_step_that_waits_for_python_data_points_at_the_loader_line():
    step = Phase("step", 9, 50.0, 1, ops=40, op_ms=1.0)
    m = replace(
        BASE, kind="script", unit="step", phases=(step,), idle_pct=92.0, idle_source="train.py:12", idle_source_pct=97.0
    )
    f = input_pipeline(m)
    assert f.evidence == (
        "no op runs for 92 % of each step (46 ms of 50 ms) while the host runs train.py:12 "
        "(97 % of the samples): the device waits for the input"
    )
    assert f.place == "train.py:12" and f.gain == "steps up to ×12 faster (4 ms per step)"
    assert diagnose(m)[0].rule == "input-pipeline"
    assert host_bound(m) is None  # the wait is the input's, not the ops' overhead
    assert input_pipeline(replace(m, idle_pct=20.0)) is None


def test_a_clean_run_has_nothing_above_info_and_says_so_in_at_most_ten_lines():
    d = Diagnosis.of(BASE)
    assert all(f.severity == "info" for f in d.findings)
    text = render_text(d)
    assert len(text.splitlines()) <= 10
    assert text.splitlines()[0].startswith("diagnose model.gguf on cpu: prefill 32 tok 300 ms · decode 10 token/s")


def test_every_rule_is_in_the_table_once_and_the_markdown_lists_the_findings():
    assert len({r.name for r in RULES}) == len(RULES) == 11
    md = render_markdown(Diagnosis.of(BASE))
    assert "| 1 | info | memory | decode reads 515 MiB per token" in md


def test_diff_says_which_findings_went_away_and_the_bound_now():
    leak = Issue("fallback", "high", "norm on cpu", "norm", "engine/trace/planted.py:32", "fix", 61.0)
    a = Diagnosis.of(replace(BASE, issues=(leak,))).summary()
    b = Diagnosis.of(BASE).summary()
    d = diff(a, b)
    assert [f["rule"] for f in d["gone"]] == ["placement"] and d["new"] == []
    assert d["bound"] == ("prefill: compute, decode: memory", "prefill: compute, decode: memory")
    assert Diagnosis.from_summary(b).findings == Diagnosis.of(BASE).findings


def test_the_docs_table_lists_every_rule_with_its_bound_and_severity():
    docs = (Path(__file__).resolve().parents[3] / "docs" / "diagnose.md").read_text()
    rows = {line.split("|")[1].strip(): line for line in docs.splitlines() if line.startswith("| ")}
    for rule in RULES:
        cells = [c.strip() for c in rows[rule.name].split("|")]
        assert cells[2] == rule.bound and int(cells[4]) == rule.rank


def test_the_phase_a_roof_holds_most_tightly_is_the_one_named():
    # a load spike made an 8-token prefill (5 % of the bandwidth) take longer than the decode (54 %)
    slow_prefill = replace(PREFILL, tokens=8, flop=2.2e9, wall_ms=2500.0)
    m = replace(BASE, phases=(slow_prefill, replace(DECODE, passes=11)))
    assert memory_bound(m).evidence.startswith("decode reads 515 MiB per token")


def test_diff_keeps_a_bound_whose_top_module_moved_and_foreign_load_whose_neighbours_changed():
    a = Diagnosis.of(replace(BASE, other_cores=0.9, neighbours=(Neighbour(1, "a", 0.9),))).summary()
    moved = replace(DECODE, top_module="lm_head", top_source="engine/models/transformer.py:289")
    b = Diagnosis.of(
        replace(BASE, phases=(BASE.phases[0], moved), other_cores=0.8, neighbours=(Neighbour(2, "b", 0.8),))
    ).summary()
    d = diff(a, b)
    assert d["gone"] == [] and d["new"] == []
    assert [f["rule"] for f in d["kept"]] == ["foreign-load", "memory-bound", "compute-bound"]


def test_on_a_gpu_the_host_bound_finding_and_the_headline_say_how_long_the_device_idles():
    tiny = Phase("decode", 31, 3.0, 1, flop=2e5, bytes=150e3, ops=96, top_module="layers.*.attn", device_busy_pct=12.0)
    m = replace(BASE, target="cuda", phases=(tiny,), dispatch_us=12.0)
    assert host_bound(m).evidence.endswith("their work needs ~0.015 ms; the device idles 88 % of it: host-bound")
    assert "decode 333 token/s (3 ms, 96 ops, device busy 12 %)" in render_text(Diagnosis.of(m)).splitlines()[0]


def test_exact_matvecs_that_int8_activations_would_run_faster_point_at_activations_q8():
    # decode takes 100 ms a token; its matvecs took 80 ms exact and 45 ms with int8 activations
    m = replace(BASE, matvec_exact_ms=80.0, matvec_int8_ms=45.0, matvec_types="Q4_K, Q6_K")
    f = exact_activations(m)
    assert (f.rule, f.bound, f.severity) == ("exact-activations", "dequantize arithmetic", "low")
    assert f.evidence == (
        "decode (100 ms a token): one pass over the fast path's matvecs took 80 ms in exact float32 and "
        "45 ms with int8 activations here: converting each weight to float32 and multiplying it, not "
        "reading it, sets the pace"
    )
    assert f.place == "the quantized linears (Q4_K, Q6_K)"
    assert f.fix.startswith("int8 activations, llama.cpp's scheme (`--fastpath activations=q8`; in the window, Engine")
    assert f.gain == "~15.4 tokens/s instead of 10"
    assert [x.rule for x in diagnose(m)][:1] == ["exact-activations"]  # low: above the info bounds


def test_no_activations_finding_where_int8_saves_under_a_tenth_or_nothing_was_timed():
    assert exact_activations(replace(BASE, matvec_exact_ms=50.0, matvec_int8_ms=41.0)) is None  # 9 of 100 ms
    assert exact_activations(replace(BASE, matvec_exact_ms=50.0, matvec_int8_ms=40.0)) is not None
    assert exact_activations(BASE) is None  # the plain model, or q8 already: not timed
    assert exact_activations(replace(BASE, matvec_exact_ms=80.0, matvec_int8_ms=45.0, simulated=True)) is None
