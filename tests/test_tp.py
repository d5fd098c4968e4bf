"""Tensor-parallel decode (engine.distributed.tp, tp_worker): Megatron's split over real ranks.

The reference is always one process running the same file unsplit. Real processes through
torch's launcher (engine.distributed.launch, gloo): no fake process group anywhere. The embedded
model has 3 KV heads (9 query heads), so it splits over 3 ranks, never 2; the 2-rank tests use a
small llama GGUF written as llama.cpp's converter writes one (4 query heads, 2 KV heads).
"""
from __future__ import annotations

import subprocess
import sys
import time

import pytest
import torch

from opscope.engine.distributed.tp import check_tp, shard_model
from opscope.engine.errors import ConfigError, DistributedError

N_TOKENS = 16


def _tiny_cfg(**over):
    from opscope.engine.testing.gguf_writer import hf_config

    return hf_config("llama", num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                     intermediate_size=128, vocab_size=320, **over)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """A 3-layer llama GGUF, float32 weights (std 0.15: peaked logits, so greedy picks are not ties)."""
    from opscope.engine.testing.gguf_writer import random_tensors, write_gguf

    cfg = _tiny_cfg()
    path = tmp_path_factory.mktemp("tp") / "tiny-llama-f32.gguf"
    return str(write_gguf(path, cfg, random_tensors(cfg, seed=3, std=0.15), types="F32"))


def generate_and_logits(lm, ids: list[int], n: int):
    """Rank 0's task (module-level: it crosses the spawn boundary): greedy ids and last logits."""
    from opscope.engine.events import Token
    from opscope.engine.generate import GenerationConfig

    cfg = GenerationConfig(max_tokens=n, ignore_eos=True)
    tokens = [ev.token_id for ev in lm.generate(ids, cfg) if isinstance(ev, Token)]
    meters = lm.tp.read_meters() if getattr(lm, "tp", None) is not None else None
    return tokens, lm.logits(ids)[-1], meters


def _text(path, prompt: str, n: int) -> str:
    from opscope.engine.events import Finished
    from opscope.engine.generate import GenerationConfig
    from opscope.engine.loaded import load_plain

    events = load_plain(path).generate(prompt, GenerationConfig(max_tokens=n, ignore_eos=True))
    return next(ev for ev in events if isinstance(ev, Finished)).text


def _one_process(path, ids, n=N_TOKENS):
    from opscope.engine.loaded import load_plain

    return generate_and_logits(load_plain(path), ids, n)


def _split(path, ids, nproc, n=N_TOKENS):
    from opscope.engine.distributed.tp_worker import TPJob, run_tp

    return run_tp(TPJob(model=path, nproc=nproc, threads=1, timeout_s=120), generate_and_logits, ids, n)


# -- one process: the split itself ----------------------------------------------------------------
def test_sharded_blocks_sum_to_the_whole_block():
    """Each rank's attention and MLP (reduce left out) add up to the unsplit layer's output:
    column-parallel q/k/v/gate/up, row-parallel o/down, KV heads split with their query groups."""
    from opscope.engine.models.config import ModelConfig
    from opscope.engine.models.llama import Transformer, rope_cos_sin

    cfg = ModelConfig(arch="llama", dim=64, n_layers=2, n_heads=8, n_kv_heads=4, hidden_dim=96,
                      vocab_size=100, max_seq_len=64, qkv_bias=True)
    world, T = 2, 5
    whole = Transformer.random(cfg, seed=1)
    x = torch.randn(1, T, cfg.dim)
    cos, sin = rope_cos_sin(whole.inv_freq, torch.arange(T).view(1, T), torch.float32)
    parts = []
    for rank in range(world):
        m = Transformer.random(cfg, seed=1)
        shard_model(m, rank, world, reduce=lambda out: out)
        parts.append(m)
    with torch.inference_mode():
        for i, block in enumerate(whole.layers):
            attn = sum(p.layers[i].attn(x, cos, sin, 0, None) for p in parts)
            mlp = sum(p.layers[i].mlp(x) for p in parts)
            torch.testing.assert_close(attn, block.attn(x, cos, sin, 0, None), atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(mlp, block.mlp(x), atol=1e-5, rtol=1e-5)
    assert parts[1].layers[0].attn.k_proj.weight.shape == (4 // world * cfg.head_dim, cfg.dim)
    assert parts[1].config.n_kv_heads == 2 and parts[1].config.hidden_dim == 48


def test_process_count_that_does_not_divide_the_kv_heads_is_one_line():
    from opscope.engine.formats import open_model

    with pytest.raises(ConfigError, match=r"--nproc 2 does not divide the model's 3 KV heads .* use --nproc 1 or 3") as e:
        check_tp(open_model(None).config, 2)
    assert "\n" not in str(e.value)


# -- real ranks through the launcher --------------------------------------------------------------
def test_two_ranks_decode_the_same_greedy_tokens_and_logits(tiny_gguf):
    ids = [5, 17, 42, 99, 3, 250, 7]
    ref_tokens, ref_logits, _ = _one_process(tiny_gguf, ids)
    tokens, logits, meters = _split(tiny_gguf, ids, 2)
    assert tokens == ref_tokens and len(tokens) == N_TOKENS
    assert (logits - ref_logits).abs().max().item() <= 1e-4
    # 3 layers x 2 all_reduces per forward; each rank timed its decode steps
    assert [m["decode_steps"] for m in meters] == [N_TOKENS - 1] * 2
    assert all(0 < m["allreduce_pct_median"] < 100 for m in meters)


def test_a_rank_that_dies_mid_decode_gives_one_line_and_nothing_hangs(tiny_gguf, monkeypatch):
    monkeypatch.setenv("OPSCOPE_TP_DIE_AT", "1:6")  # rank 1 exits abruptly at its 6th forward
    t0 = time.monotonic()
    with pytest.raises(DistributedError) as e:
        _split(tiny_gguf, [5, 17, 42], 2, n=32)
    assert time.monotonic() - t0 < 60
    assert str(e.value).startswith("rank 1 failed: exited with code 3") and "rank 0 stopped" in str(e.value)
    assert "\n" not in str(e.value)


def test_cli_generate_nproc_streams_the_same_text_as_one_process(tiny_gguf, tmp_path):
    """Rank 0 streams to the terminal; the other rank prints nothing."""
    two = subprocess.run([sys.executable, "-m", "opscope.engine.cli", "generate", "hello", "-m", tiny_gguf,
                          "-n", "12", "--ignore-eos", "--nproc", "2"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=90)
    assert two.returncode == 0, two.stderr
    expected = _text(tiny_gguf, "hello", 12)
    assert two.stdout == expected and expected.strip()
    assert "generated 12 tok" in two.stderr


@pytest.mark.slow
def test_embedded_model_over_three_ranks_matches_one_process(default_model_path):
    """The embedded model (dense float32 weights) over its 3 KV heads, one per rank."""
    from opscope.engine.formats import open_model

    ids = open_model(None).tokenizer.encode("The capital of France is")
    ref_tokens, ref_logits, _ = _one_process(None, ids)
    tokens, logits, _ = _split(None, ids, 3)
    assert tokens == ref_tokens
    assert (logits - ref_logits).abs().max().item() <= 1e-4


def test_quantized_fast_path_flags_with_nproc_are_one_line():
    from argparse import Namespace

    from opscope.engine.distributed.tp_worker import job_from_args

    args = Namespace(backend="torch", compile="off", quantize="off", fastpath="activations=q8", device="cpu",
                     model=None, dtype="float32", attention="sdpa", threads=None, nproc=2)
    with pytest.raises(ConfigError, match="the quantized fast path stays single-process"):
        job_from_args(args)
    with pytest.raises(ConfigError, match="drop --compile/--quantize"):
        job_from_args(Namespace(**{**vars(args), "fastpath": "auto", "quantize": "int8"}))


def bench_llm_tiny(lm):
    """Rank 0's task: the llm suite on the split model, tiny sizes, nothing saved."""
    from opscope.engine.bench.options import BenchOptions
    from opscope.engine.bench.session import run_suite
    from opscope.engine.bench.suites.llm import Params

    opts = BenchOptions(model=lm.source.path, quick=True, fastpath="off", repeat=2, min_time_s=0.0, warmup=1)
    params = Params(pp=8, tg=4, depths=(0,), gen_prompt=4, gen_tokens=4)
    _, result = run_suite("llm", opts, None, params=params, model=lm)
    return result.status, result.settings["suite_params"]["model"], {m.name: list(m.samples) for m in result.metrics}


def test_bench_llm_records_each_decode_steps_allreduce_share_per_rank(tiny_gguf):
    from opscope.engine.distributed.tp_worker import TPJob, run_tp

    status, model, metrics = run_tp(TPJob(model=tiny_gguf, nproc=2, threads=1, timeout_s=120), bench_llm_tiny)
    assert status == "completed" and model["nproc"] == 2
    assert metrics["tg4"] and metrics["pp8"]
    for rank in (0, 1):
        shares = metrics[f"tg4.allreduce_pct_r{rank}"]
        assert len(shares) >= 2 * 4 and all(0 < v < 100 for v in shares)  # every decode step of every rep
