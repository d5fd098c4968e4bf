"""Tensor-parallel scaling: pp512 and tg128 for N ranks vs one, with each rank's all_reduce share.

    .venv/bin/python benchmarks/tp_scaling.py [--rounds 3] [--reps 2] [--pp 512] [--tg 128]
                                              [--model synthetic|default] [--nproc 1,2] [--threads T] [--out FILE]

Every (N, round) is one launch through torch's launcher (engine.distributed.launch, gloo on the
CPU): each rank loads the model (dense float32, the plain torch model: the quantized fast path
stays single-process), shards it (engine.distributed.tp), and rank 0 times ``--reps`` pp and tg
passes after a warm-up, as `opscope bench llm` does (prefill: one forward of N tokens, last-position
logits; decode: N single-token steps with the cache, each synchronised). N=1 runs through the same
launcher and code path, so the comparison is only the split. Rounds interleave the N values
(ABBA order) so the machine's drift hits both; medians and the spread (min–max) are reported.

The embedded SmolLM2-135M has 9 query heads and 3 KV heads: it splits over 1 or 3 ranks only.
``--model synthetic`` (default) writes a model of the same size and depth with 4 KV heads (12 query
heads of 48, dim 576, 30 layers, ffn 1536, vocab 49152, tied embeddings; random F16 weights) into
~/.cache/opscope/tp_scaling, so that N=2 can be measured.

A benchmark only, never run in CI.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "opscope" / "tp_scaling"
SYNTHETIC = dict(
    hidden_size=576,
    num_hidden_layers=30,
    intermediate_size=1536,
    num_attention_heads=12,
    num_key_value_heads=4,
    head_dim=48,
    vocab_size=49152,
    max_position_embeddings=2048,
    rms_norm_eps=1e-5,
    rope_theta=100000.0,
    tie_word_embeddings=True,
)

WHY_NO_SPEEDUP = (
    "Why no speed-up on this machine: it has 2 cores shared by other jobs. Batch-1 decode is "
    "memory-bound and the plain model's batch-1 matmuls already run one thread per rank, so the most "
    "a split can win is a second core's bandwidth; against that, every token costs 2 all_reduces per "
    "layer (60 for 30 layers) over gloo's loopback TCP, each a barrier that waits for the slowest "
    "rank — any descheduling of one rank stalls all of them — and the replicated output head "
    "(49152x576, the largest matmul) runs on rank 0 alone while the others wait. Tensor parallelism "
    "pays where each rank has its own device and a fast link (NVLink, NCCL), not on 2 shared cores."
)


def measure(lm, pp: int, tg: int, reps: int) -> dict:
    """Rank 0's task: ``reps`` timed pp and tg passes after one warm-up of each; tg's per-step
    all_reduce shares from every rank."""
    import torch
    from opscope.engine.generation.generate import decode_threads

    model, vocab = lm.model, lm.config.vocab_size
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (1, pp), generator=g)
    steps = torch.randint(0, vocab, (1, tg), generator=g)
    out = {"pp_s": [], "tg_s": [], "shares": None}
    with torch.inference_mode():
        for rep in range(reps + 1):
            model.setup_cache(1, pp)
            t0 = time.perf_counter()
            model(prompt, 0, last_only=True)
            pp_s = time.perf_counter() - t0
            model.setup_cache(1, tg)
            if rep == 1:  # the timed reps' decode steps give the shares (not the warm-up's)
                lm.tp.reset_meters()
            with decode_threads(model):
                t0 = time.perf_counter()
                for i in range(tg):
                    model(steps[:, i : i + 1], i, last_only=True)
                tg_s = time.perf_counter() - t0
            if rep:  # rep 0 is the warm-up
                out["pp_s"].append(pp_s)
                out["tg_s"].append(tg_s)
    out["shares"] = [m["allreduce_pct"] for m in lm.tp.read_meters()]
    return out


def model_path(kind: str) -> str | None:
    if kind == "default":
        return None
    from opscope.engine.testing.gguf_writer import hf_config, write_gguf

    path = CACHE / "llama-576d-30L-kv4.F16.gguf"
    if not path.is_file():
        CACHE.mkdir(parents=True, exist_ok=True)
        print(f"writing {path} (random weights, once)", file=sys.stderr)
        write_gguf(path, hf_config("llama", **SYNTHETIC), types="F16")
    return str(path)


def run_one(path, nproc: int, args) -> dict:
    from opscope.engine.distributed.tp_worker import TPJob, run_tp

    threads = args.threads or max(1, (os.cpu_count() or 1) // nproc)
    return run_tp(TPJob(model=path, nproc=nproc, threads=threads, timeout_s=3600), measure, args.pp, args.tg, args.reps)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} [{min(values):.1f}–{max(values):.1f}]"


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def table(results: dict, args) -> list[str]:
    rows = [
        f"| N | pp{args.pp} tok/s median [min–max] | tg{args.tg} tok/s median [min–max] | "
        f"tg vs N=1 | all_reduce share of a decode step, per rank: median [min–max] % |",
        "| --- | --- | --- | --- | --- |",
    ]
    base = None
    for n, runs in results.items():
        pp = [args.pp / s for r in runs for s in r["pp_s"]]
        tg = [args.tg / s for r in runs for s in r["tg_s"]]
        base = base or statistics.median(tg)
        shares = []
        for rank in range(n):
            vals = [v for r in runs for v in r["shares"][rank]]
            shares.append(f"r{rank} {spread(vals)}")
        rows.append(
            f"| {n} | {spread(pp)} | {spread(tg)} | {statistics.median(tg) / base:.2f}× | {'; '.join(shares)} |"
        )
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("synthetic", "default"), default="synthetic")
    p.add_argument("--nproc", default=None, help="comma-separated N values (default 1,2; 1,3 for --model default)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--reps", type=int, default=2, help="timed passes per launch (after one warm-up)")
    p.add_argument("--pp", type=int, default=512)
    p.add_argument("--tg", type=int, default=128)
    p.add_argument("--threads", type=int, default=None, help="threads per rank (default: logical CPUs // N)")
    p.add_argument("--out", default=None, help="also write the markdown table here")
    args = p.parse_args()
    ns = [int(x) for x in (args.nproc or ("1,3" if args.model == "default" else "1,2")).split(",")]
    path = model_path(args.model)
    before = uptime()
    results: dict[int, list] = {n: [] for n in ns}
    for rnd in range(args.rounds):
        order = ns if rnd % 2 == 0 else ns[::-1]  # ABBA: drift hits every N alike
        for n in order:
            t0 = time.monotonic()
            results[n].append(run_one(path, n, args))
            print(f"round {rnd + 1}/{args.rounds} N={n}: {time.monotonic() - t0:.0f} s", file=sys.stderr)
    after = uptime()
    lines = [
        f"model: {args.model} ({path or 'embedded SmolLM2-135M, dense float32'}); "
        f"{args.rounds} rounds x {args.reps} reps, gloo, {os.cpu_count()} logical CPUs, "
        f"threads per rank = {args.threads or 'logical CPUs // N'}",
        f"uptime before: {before}",
        f"uptime after:  {after}",
        "",
        *table(results, args),
        "",
        WHY_NO_SPEEDUP,
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
