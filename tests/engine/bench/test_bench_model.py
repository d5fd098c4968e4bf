"""The suites that run the real default model (SmolLM2-135M, loaded once for this module)."""

from __future__ import annotations

import math

import pytest
from opscope.engine.bench.measure.options import BenchOptions
from opscope.engine.bench.session import run_suite
from opscope.engine.bench.suites import _model as M
from opscope.engine.bench.suites import batch, kv_cache, llm

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread", "known_peaks")]
OPTS = BenchOptions(quick=True, repeat=2, min_time_s=0.0, warmup=1)


@pytest.fixture(scope="module")
def lm():
    from opscope.engine.api import load

    return load()


def by_name(result):
    return {m.name: m for m in result.metrics}


def test_llm_tiny_llama_bench_names_generation_metrics_and_mfu(lm):
    p = llm.Params(pp=8, tg=4, depths=(0, 8), gen_prompt=8, gen_tokens=4)
    _, result = run_suite("llm", OPTS, None, params=p, model=lm)
    m = by_name(result)
    assert result.status == "completed", result.error
    for name in ("pp8", "tg4", "pp8@d8", "tg4@d8"):
        assert m[name].unit == "tok/s" and all(v > 0 for v in m[name].samples)
        assert all(0 < v < 100 for v in m[f"{name}.mfu"].samples)  # of the theoretical peak
        assert all(0 < v < 100 for v in m[f"{name}.mfu_measured"].samples)
    assert all(0 < v for v in m["tg4.mbu_measured"].samples)  # a CPU has no theoretical bandwidth here
    assert "tg4.mbu" not in m and m["tg4.mfu"].params["peak_basis"] == "theoretical"
    assert m["tg4@d8"].params == {"n_gen": 4, "depth": 8}
    reps = len(m["e2e_p8_g4"].samples)
    assert len(m["itl"].samples) == reps * 3  # every inter-token latency after the first token, kept raw
    assert len(m["ttft"].samples) == reps and all(t > 0 for t in m["ttft"].samples)
    for i in range(reps):  # per request, p50 <= p95 <= p99
        assert m["itl_p50"].samples[i] <= m["itl_p95"].samples[i] <= m["itl_p99"].samples[i]
    settings = result.settings["suite_params"]
    assert settings["peaks"]["flop"]["measured"]["source"] == "test"
    assert settings["peaks"]["flop"]["theoretical"]["basis"] == "theoretical"
    assert result.fingerprint["model"]["sha256"] and len(result.fingerprint["model"]["sha256"]) == 64


@pytest.fixture(scope="module")
def dense_lm():
    from opscope.engine.api import load

    return load(fastpath="off")


def test_mbu_bytes_count_weights_once_and_the_embedding_row(dense_lm):
    cfg = dense_lm.config
    w = M.weight_bytes_per_step(dense_lm.model)
    total = sum(p.numel() * p.element_size() for p in {id(p): p for p in dense_lm.model.parameters()}.values())
    if cfg.tie_embeddings:  # the output head reads the whole (shared) table
        assert w == total
    else:
        assert w == total - (cfg.vocab_size - 1) * cfg.dim * 4


def test_mbu_bytes_of_the_fast_path_are_its_packed_blocks(lm, dense_lm):
    """With the CPU fast path the head reads the table's Q8_0 blocks; a lookup into a table of its
    own reads one row. Counting them must not dequantize the head (``lm_head.weight``)."""
    if lm.options.fastpath == "off":
        pytest.skip("the fast path is not active (no C compiler here)")
    model = lm.model
    named = {
        t.data_ptr(): (n, t)
        for n, t in list(model.named_parameters()) + list(model.named_buffers())
        if ".cache." not in n and "inv_freq" not in n and t.numel()
    }
    head = {t.data_ptr() for t in list(model.lm_head.parameters()) + list(model.lm_head.buffers())}
    total = sum(t.numel() * t.element_size() for _, t in named.values())
    own_table = sum(
        t.numel() * t.element_size() for ptr, (n, t) in named.items() if n.startswith("embed.") and ptr not in head
    )
    expected = total - own_table + own_table // lm.config.vocab_size
    before = _reset_peak_rss_kb()
    assert M.weight_bytes_per_step(model) == expected
    assert _vm_kb("VmHWM") - before < 20_000, "weight_bytes_per_step materialized a dense weight"
    assert M.weight_bytes_per_step(model) < 0.9 * M.weight_bytes_per_step(dense_lm.model)


def _vm_kb(key: str) -> int:
    from pathlib import Path

    return int(
        next(ln for ln in Path("/proc/self/status").read_text().splitlines() if ln.startswith(key + ":")).split()[1]
    )


def _reset_peak_rss_kb() -> int:
    """Resets the peak RSS (VmHWM) to the current RSS (Linux clear_refs 5) and returns it."""
    from pathlib import Path

    Path("/proc/self/clear_refs").write_text("5")
    return _vm_kb("VmHWM")


def test_forward_flops_match_the_closed_form(lm):
    cfg = lm.config
    one = M.forward_flops(cfg, 1, 0)
    assert one == pytest.approx(
        2 * M.body_matmul_params(cfg) + 2 * cfg.dim * cfg.vocab_size + 4 * cfg.n_layers * cfg.n_heads * cfg.head_dim
    )
    # n tokens at once = the same tokens one at a time with a growing cache
    assert M.forward_flops(cfg, 5, 3) == pytest.approx(sum(M.forward_flops(cfg, 1, 3 + i) for i in range(5)))


def test_kv_cache_tiny_cached_and_recomputed(lm):
    _, result = run_suite("kv-cache", OPTS, None, params=kv_cache.Params(seq_lens=(8,)), model=lm)
    m = by_name(result)
    assert result.status == "completed"
    assert m["decode_cached@8"].params["mode"] == "kv-cache" and m["decode_cached@8"].samples
    assert m["decode_recompute@8"].samples


def test_kv_cache_cached_step_gives_the_recomputed_logits(lm):
    import torch

    step_c = kv_cache.cached_point(lm, 12, OPTS).prepare()
    logits_c = step_c()[0, -1]
    step_r = kv_cache.recompute_point(lm, 12, OPTS).prepare()
    logits_r = step_r()[0, -1]
    torch.testing.assert_close(logits_c, logits_r, atol=2e-3, rtol=1e-3)


def test_batch_tiny_throughput_and_latency(lm):
    _, result = run_suite("batch", OPTS, None, params=batch.Params(batches=(1, 2), prompt=4, steps=2), model=lm)
    m = by_name(result)
    assert result.status == "completed"
    for b in (1, 2):
        tps, lat = m[f"batch{b}"].samples, m[f"batch{b}.latency"].samples
        assert all(math.isclose(ms, b / t * 1e3) for t, ms in zip(tps, lat))
