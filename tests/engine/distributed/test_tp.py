"""Tensor-parallel decode (engine.distributed.tp, tp_worker): Megatron's split over real ranks.

The reference is always one process running the same file unsplit. Real processes through
torch's launcher (engine.distributed.launch, gloo): no fake process group anywhere. The embedded
model has 3 KV heads (9 query heads), so it splits over 3 ranks, never 2; the 2-rank tests use a
small llama GGUF written as llama.cpp's converter writes one (4 query heads, 2 KV heads).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch
from opscope.engine.core.errors import ConfigError, DistributedError
from opscope.engine.distributed.tp import check_tp, shard_model
from ranks_helpers import (
    allreduce_shares,
    assert_lane_of_each_rank,
    assert_printed_medians_are_the_traces,
    load_run,
    rank_lanes_panel,
    rank_slices,
)

N_TOKENS = 16


def _tiny_cfg(**over):
    from opscope.engine.testing.gguf_writer import hf_config

    return hf_config(
        "llama",
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=320,
        **over,
    )


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """A 3-layer llama GGUF, float32 weights (std 0.15: peaked logits, so greedy picks are not ties)."""
    from opscope.engine.testing.gguf_writer import random_tensors, write_gguf

    cfg = _tiny_cfg()
    path = tmp_path_factory.mktemp("tp") / "tiny-llama-f32.gguf"
    return str(write_gguf(path, cfg, random_tensors(cfg, seed=3, std=0.15), types="F32"))


def generate_and_logits(lm, ids: list[int], n: int):
    """Rank 0's task (module-level: it crosses the spawn boundary): greedy ids and last logits."""
    from opscope.engine.generation.events import Token
    from opscope.engine.generation.generate import GenerationConfig

    cfg = GenerationConfig(max_tokens=n, ignore_eos=True)
    tokens = [ev.token_id for ev in lm.generate(ids, cfg) if isinstance(ev, Token)]
    meters = lm.tp.read_meters() if getattr(lm, "tp", None) is not None else None
    return tokens, lm.logits(ids)[-1], meters


def _text(path, prompt: str, n: int) -> str:
    from opscope.engine.generation.events import Finished
    from opscope.engine.generation.generate import GenerationConfig
    from opscope.engine.generation.loaded import load_plain

    events = load_plain(path).generate(prompt, GenerationConfig(max_tokens=n, ignore_eos=True))
    return next(ev for ev in events if isinstance(ev, Finished)).text


def _one_process(path, ids, n=N_TOKENS):
    from opscope.engine.generation.loaded import load_plain

    return generate_and_logits(load_plain(path), ids, n)


def _split(path, ids, nproc, n=N_TOKENS):
    from opscope.engine.distributed.tp_worker import TPJob, run_tp

    return run_tp(TPJob(model=path, nproc=nproc, threads=1, timeout_s=120), generate_and_logits, ids, n)


# -- one process: the split itself ----------------------------------------------------------------
def test_sharded_blocks_sum_to_the_whole_block():
    """Each rank's attention and MLP (reduce left out) add up to the unsplit layer's output:
    column-parallel q/k/v/gate/up, row-parallel o/down, KV heads split with their query groups."""
    from opscope.engine.models.config import ModelConfig
    from opscope.engine.models.transformer import Transformer, rope_cos_sin

    cfg = ModelConfig(
        arch="llama",
        dim=64,
        n_layers=2,
        n_heads=8,
        n_kv_heads=4,
        hidden_dim=96,
        vocab_size=100,
        max_seq_len=64,
        qkv_bias=True,
    )
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

    with pytest.raises(
        ConfigError, match=r"--nproc 2 does not divide the model's 3 KV heads .* use --nproc 1 or 3"
    ) as e:
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


def test_cli_generate_nproc_streams_the_same_text_and_prints_the_share_its_trace_shows(tiny_gguf, tmp_path):
    """Rank 0 streams to the terminal; the other rank prints nothing. The all_reduce share printed
    is the one the per-rank trace file gives, rank by rank."""
    import json

    trace = tmp_path / "ranks.json"
    two = subprocess.run(
        [
            sys.executable,
            "-m",
            "opscope.engine.cli.main",
            "generate",
            "hello",
            "-m",
            tiny_gguf,
            "-n",
            "12",
            "--ignore-eos",
            "--nproc",
            "2",
            "--trace-out",
            str(trace),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert two.returncode == 0, two.stderr
    expected = _text(tiny_gguf, "hello", 12)
    assert two.stdout == expected and expected.strip()
    assert "generated 12 tok" in two.stderr
    doc = json.loads(trace.read_text())
    shares = allreduce_shares(doc)
    assert sorted(shares) == [0, 1] and [len(v) for v in shares.values()] == [11, 11]  # 12 tokens: 11 steps
    assert all(0 < v < 100 for vs in shares.values() for v in vs)
    assert_printed_medians_are_the_traces(two.stderr, doc)
    assert "computed longest" in two.stderr


def test_cli_generate_nproc_1_runs_the_tensor_parallel_path_as_a_world_of_one(tiny_gguf, tmp_path):
    """A one-GPU machine's only way onto the launcher, the process group and the all_reduces:
    `--nproc 1` given is the tensor-parallel path (one rank), not the plain process it is without."""
    import json

    argv = [
        sys.executable,
        "-m",
        "opscope.engine.cli.main",
        "generate",
        "hello",
        "-m",
        tiny_gguf,
        "-n",
        "6",
        "--ignore-eos",
        "--temperature",
        "0",
        "--json",
    ]
    one = subprocess.run([*argv, "--nproc", "1"], cwd=tmp_path, capture_output=True, text=True, timeout=90)
    plain = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=90)
    assert one.returncode == 0, one.stderr
    got, ref = json.loads(one.stdout), json.loads(plain.stdout)
    assert (got["tensor_parallel"], got["nproc"]) == (True, 1) and "tensor_parallel" not in ref
    assert got["text"] == _text(tiny_gguf, "hello", 6)
    assert "all_reduce" in one.stderr  # rank 0's share line, as with --nproc 2


@pytest.mark.slow
def test_embedded_model_over_three_ranks_matches_one_process(default_model_2_layers):
    """The embedded model (dense float32 weights) over its 3 KV heads, one per rank: its first 2
    layers (gguf_craft.first_layers_gguf; every layer is split the same way, and 2 layers already
    chain a reduced output into the next layer's split), each rank loading the real file."""
    from opscope.engine.formats import open_model

    path = str(default_model_2_layers)
    model = open_model(path)
    assert (model.config.n_layers, model.config.n_kv_heads, model.config.n_heads) == (2, 3, 9)
    ids = model.tokenizer.encode("The capital of France is")
    ref_tokens, ref_logits, _ = _one_process(path, ids)
    tokens, logits, _ = _split(path, ids, 3)
    assert tokens == ref_tokens
    assert (logits - ref_logits).abs().max().item() <= 1e-4


def test_quantized_fast_path_flags_with_nproc_are_one_line():
    from argparse import Namespace

    from opscope.engine.distributed.tp_worker import job_from_args

    args = Namespace(
        backend="torch",
        compile="off",
        quantize="off",
        fastpath="activations=q8",
        device="cpu",
        model=None,
        dtype="float32",
        attention="sdpa",
        threads=None,
        nproc=2,
    )
    with pytest.raises(ConfigError, match="the quantized fast path stays single-process"):
        job_from_args(args)
    with pytest.raises(ConfigError, match="drop --compile/--quantize"):
        job_from_args(Namespace(**{**vars(args), "fastpath": "auto", "quantize": "int8"}))


TINY_BENCH = [
    "--quick",
    "--param",
    "pp=8",
    "--param",
    "tg=4",
    "--param",
    "depths=0",
    "--param",
    "gen_prompt=4",
    "--param",
    "gen_tokens=4",
    "--repeat",
    "2",
    "--warmup",
    "1",
    "--min-time",
    "0",
]


@pytest.fixture(scope="module")
def tp_bench(tiny_gguf, tmp_path_factory):
    """One real `bench llm --nproc 2` (in-process CLI; the ranks through the launcher), saved, with
    its per-rank trace: (stored run, trace document, what it printed)."""
    import json

    from opscope.engine.cli.main import main

    d = tmp_path_factory.mktemp("tpbench")
    db, trace, out = str(d / "runs.db"), d / "ranks.json", d / "out.txt"
    with open(out, "w") as f:  # rank 0 prints to the fd 1 it inherits
        saved = os.dup(1)
        os.dup2(f.fileno(), 1)
        try:
            code = main(
                [
                    "--db",
                    db,
                    "bench",
                    "llm",
                    "-m",
                    tiny_gguf,
                    "--nproc",
                    "2",
                    *TINY_BENCH,
                    "--name",
                    "tp",
                    "--trace-out",
                    str(trace),
                ]
            )
        finally:
            os.dup2(saved, 1)
            os.close(saved)
    assert code == 0, out.read_text()[-2000:]
    return load_run(db, "tp"), json.loads(trace.read_text()), out.read_text()


def test_bench_llm_records_each_decode_steps_allreduce_share_per_rank_from_its_spans(tp_bench):
    """tg's per-rank share samples, the run's rank markers and the trace are the same spans."""
    run, doc, printed = tp_bench
    assert run.status == "completed" and run.settings["suite_params"]["model"]["nproc"] == 2
    metrics = {m.name: list(m.samples) for m in run.metrics}
    assert metrics["tg4"] and metrics["pp8"]
    traced = allreduce_shares(doc)
    for rank in (0, 1):
        assert f"tg4.allreduce_pct_r{rank}" in metrics, sorted(metrics)
        shares = metrics[f"tg4.allreduce_pct_r{rank}"]
        assert len(shares) >= 2 * 4 and all(0 < v < 100 for v in shares)  # every decode step of every rep
        for v in shares:  # each one is a decode step of this rank in the trace
            assert min(abs(v - t) for t in traced[rank]) < 1e-6
    assert_printed_medians_are_the_traces(printed, doc)
    # markers: every forward and all_reduce of each rank, as in the trace (3 layers: 6 all_reduces a forward)
    by = {}
    for m in run.markers:
        by.setdefault((m.phase, m.attrs["rank"], m.edge), []).append(m)
    slices = rank_slices(doc)
    assert sorted(slices) == [0, 1]
    for rank in (0, 1):
        fwd = [e for e in slices[rank] if e["name"] != "all_reduce"]
        ars = [e for e in slices[rank] if e["name"] == "all_reduce"]
        assert len(by["forward", rank, "start"]) == len(by["forward", rank, "end"]) == len(fwd)
        assert len(by["all_reduce", rank, "start"]) == len(ars) == 6 * len(fwd)


@pytest.mark.gui
def test_a_tensor_parallel_runs_forwards_and_all_reduces_are_rank_lanes(tp_bench, qtbot):
    """The stored markers of the real run, replayed ending now: per rank a forwards lane and its
    all_reduces over it."""
    panel = rank_lanes_panel(tp_bench[0].markers, qtbot)
    assert sorted(panel.rank_curves) == sorted(panel.rank_comm_curves) == [0, 1]
    for rank in (0, 1):
        for curve in (panel.rank_curves[rank], panel.rank_comm_curves[rank]):
            assert_lane_of_each_rank(curve, rank)
    assert not panel.grab().isNull()
    panel.shutdown()


@pytest.fixture(scope="module")
def long_gguf(tmp_path_factory):
    """tiny_gguf's model with room for a reply that outlasts a busy host's scheduling delays."""
    from opscope.engine.testing.gguf_writer import random_tensors, write_gguf

    cfg = _tiny_cfg(max_position_embeddings=8192)
    path = tmp_path_factory.mktemp("tp-long") / "tiny-llama-f32.gguf"
    return str(write_gguf(path, cfg, random_tensors(cfg, seed=3, std=0.15), types="F32"))


def test_ctrl_c_in_a_tensor_parallel_chat_stops_the_reply_then_ends_the_chat(long_gguf, tmp_path):
    """The first Ctrl-C (to the whole process group, as a terminal sends it) stops the reply on
    every rank and the chat goes back to its prompt; a second one there ends it: exit 130, one line."""
    import signal

    err = tmp_path / "err.txt"
    code = "import sys; from opscope.engine.cli.main import main; sys.exit(main(sys.argv[1:]))"
    with open(err, "a") as f:  # O_APPEND: the launcher and rank 0 both write to it
        p = subprocess.Popen(
            [sys.executable, "-c", code, "chat", "-m", long_gguf, "-n", "8000", "--ignore-eos", "--nproc", "2"],
            cwd=tmp_path,
            start_new_session=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=f,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    try:
        p.stdin.write(b"hello\n")
        p.stdin.flush()  # kept open: after the reply the chat waits at its prompt
        seen = b""  # stdout: "\n> " (the prompt, before the input is read), then the reply
        while b"> " not in seen[:-1]:
            byte = p.stdout.read(1)
            assert byte, err.read_text()
            seen += byte
        # the reply is streaming (a Ctrl-C after only the prompt could land before the reply started,
        # at the prompt, and end the chat: seen in fresh-clone runs)
        os.killpg(p.pid, signal.SIGINT)
        deadline = time.monotonic() + 30
        while "[stopped]" not in err.read_text() and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert p.poll() is None and "[stopped]" in err.read_text(), err.read_text()
        time.sleep(0.3)  # at the prompt
        os.killpg(p.pid, signal.SIGINT)
        assert p.wait(timeout=30) == 130
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    lines = err.read_text().splitlines()
    assert lines[-1] == "opscope: interrupted (chat ended by Ctrl-C; every rank stopped)", lines
    assert not any("Traceback" in line or "death signal" in line for line in lines)
    assert lines.count("[stopped]") == 1 and not any(line.startswith("[length]") for line in lines)
