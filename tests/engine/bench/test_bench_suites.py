"""Each benchmark suite at a tiny size on CPU, through the real session and a real SQLite store."""

from __future__ import annotations

import math

import pytest
from opscope.engine.bench.ceilings import peaks
from opscope.engine.bench.measure.options import BenchOptions
from opscope.engine.bench.session import run_suite
from opscope.engine.bench.suites import attention, bandwidth, get_suite, matmul, scaling, train_step
from opscope.engine.core.errors import ConfigError

FAST = dict(quick=True, repeat=2, min_time_s=0.0, warmup=1)


pytestmark = pytest.mark.usefixtures("one_torch_thread", "known_peaks")


@pytest.fixture
def store(tmp_path):
    from opscope.engine.store import RunStore

    s = RunStore.open(f"sqlite:///{tmp_path / 'runs.db'}")
    yield s
    s.close()


def by_name(result):
    return {m.name: m for m in result.metrics}


def test_unknown_suite_lists_the_suites():
    with pytest.raises(ConfigError, match="matmul"):
        get_suite("nope")


def test_matmul_tiny_saves_gflops_and_pct_of_the_theoretical_peak(store):
    # the measured peak's rules (quiet, full, better) are tested in test_bench_peaks.py
    params = matmul.Params(dtypes=("float32", "bfloat16"), sizes=(32, 64))
    full = BenchOptions(repeat=2, min_time_s=0.0, warmup=1)
    run_id, result = run_suite("matmul", full, store, params=params, name="mm")
    m = by_name(result)
    assert result.status == "completed"
    assert all(v > 0 for v in m["matmul_float32_64"].samples)
    theory = peaks.theoretical("cpu", "matmul", "bfloat16")
    pct = m["matmul_bfloat16_64.pct_peak"]
    assert pct.params["peak"] == theory.label and pct.params["peak_basis"] == "theoretical"
    assert pct.samples == pytest.approx([g * 1e9 / theory.value * 100 for g in m["matmul_bfloat16_64"].samples])
    saved = store.get(run_id)
    assert saved.status == "completed" and {x.name for x in saved.metrics} == set(m)
    assert saved.fingerprint["settings"]["suite_params"]["sizes"] == [32, 64]


def test_quick_runs_do_not_record_peaks(store, cache_dir):
    (cache_dir / "peaks.json").unlink()
    run_suite("matmul", BenchOptions(**FAST), store, params=matmul.Params(dtypes=("float32",), sizes=(16,)))
    assert peaks.measured("cpu", "matmul", "float32") is None


def test_matmul_skips_a_size_the_measured_rate_cannot_finish(store):
    params = matmul.Params(dtypes=("float32",), sizes=(32, 8192), call_budget_s=1e-4)
    _, result = run_suite("matmul", BenchOptions(**FAST), store, params=params)
    skipped = by_name(result)["matmul_float32_8192"]
    assert skipped.status == "failed" and skipped.error.startswith("skipped: one call would take")
    assert result.status == "completed"  # a skipped size does not fail the run


def test_bandwidth_tiny_counts_read_and_write(store, cache_dir, tmp_path, monkeypatch):
    (cache_dir / "peaks.json").unlink()
    from test_bench_peaks import quiet_proc

    monkeypatch.setattr(peaks, "PROC", quiet_proc(tmp_path))  # a /proc where no other process runs
    _, result = run_suite(
        "bandwidth",
        BenchOptions(repeat=2, min_time_s=0.0, warmup=1),
        store,
        params=bandwidth.Params(sizes_bytes=(8 * 2**20,)),
    )
    m = by_name(result)["copy_8MiB"]
    assert m.unit == "GB/s" and m.params["bytes_moved_per_copy"] == 2 * 8 * 2**20
    assert all(v > 0 for v in m.samples)
    assert peaks.measured("cpu", "bandwidth", None).value == max(m.samples) * 1e9


@pytest.mark.slow
def test_attention_variants_agree_and_unavailable_backends_are_explained(store):
    import torch

    status = attention.available_variants("cpu", "float32", 16)
    assert status["naive"] == status["sdpa"] == status["sdpa_math"] == "ok"
    assert status["sdpa_efficient"].startswith("unavailable:")  # a CUDA-only kernel
    p = attention.Params(seq_lens=(24,), heads=2, head_dim=16)
    q, k, v = attention._inputs(p, 24, "cpu", "float32")
    ref = attention._call("naive")(q, k, v)
    for variant in (v_ for v_, s in status.items() if s == "ok"):
        torch.testing.assert_close(attention._call(variant)(q, k, v), ref, atol=1e-5, rtol=1e-4)
    _, result = run_suite("attention", BenchOptions(**FAST), store, params=p)
    m = by_name(result)
    assert m["attn_naive_24"].unit == "ms" and not m["attn_naive_24"].higher_is_better
    assert m["attn_sdpa_flash_24.gflop_s"].samples and m["attn_sdpa_24.peak_mem_bytes"].unit == "bytes"
    assert result.settings["suite_params"]["variants"]["sdpa_cudnn"].startswith("unavailable")


TINY_TRAIN = dict(dim=32, n_layers=1, n_heads=2, n_kv_heads=1, hidden_dim=64, vocab_size=64, batch=2, seq=16)


@pytest.mark.slow
def test_train_step_every_toggle_trains(store):
    opts = BenchOptions(quick=True, repeat=4, min_time_s=0.0, warmup=1)
    _, result = run_suite("train-step", opts, store, params=train_step.Params(**TINY_TRAIN))
    m = by_name(result)
    assert result.status == "completed", result.error
    for v in train_step.VARIANTS:
        losses = m[f"train_{v.label}.loss"].samples
        assert losses[-1] < losses[0], v.label
        assert m[f"train_{v.label}"].samples and math.isfinite(m[f"train_{v.label}.mfu"].samples[0])
    assert m["train_grad_accum4"].params["accum"] == 4


@pytest.mark.slow
def test_train_step_that_does_not_learn_fails_the_run(store):
    params = train_step.Params(**TINY_TRAIN, lr=0.0, variants=(train_step.Variant("fp32"),))
    run_id, result = run_suite("train-step", BenchOptions(**FAST), store, params=params)
    assert result.status == "failed" and "loss did not decrease" in result.error
    assert store.get(run_id).status == "failed"


def test_loss_check_rules():
    assert train_step.loss_decreased({"loss": [3.0, 2.0, 1.0]}) is None
    assert "did not decrease" in train_step.loss_decreased({"loss": [2.0, 2.0, 2.0]})
    assert "not finite" in train_step.loss_decreased({"loss": [2.0, float("nan")]})


def test_scaling_configs_are_gpt2_sized_and_too_big_is_skipped(store):
    sizes = {n: scaling.gpt2_config(n).n_params / 1e6 for n in scaling.GPT2_SHAPES}
    assert sizes["gpt2-small"] == pytest.approx(124, rel=0.02)
    assert sizes["gpt2-xl"] == pytest.approx(1558, rel=0.02)
    huge = scaling.Params(models=("gpt2-xl",), batch=100_000, seq=1024)  # logits alone: ~40 TB
    _, result = run_suite("scaling", BenchOptions(**FAST), store, params=huge)
    m = by_name(result)["fwd_gpt2-xl"]
    assert m.status == "failed" and m.error.startswith("skipped: needs")


@pytest.mark.slow
def test_scaling_smallest_forward(store):
    p = scaling.Params(models=("gpt2-small",), seq=8)
    _, result = run_suite("scaling", BenchOptions(quick=True, repeat=2, min_time_s=0.0, warmup=0), store, params=p)
    m = by_name(result)
    assert result.status == "completed" and m["fwd_gpt2-small"].params["n_params"] > 100e6
    assert 0 < m["fwd_gpt2-small.mfu"].samples[0] < 1000
