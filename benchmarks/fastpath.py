"""Interleaved A/B/A/B microbenchmarks of the CPU fast-path matvec candidates.

For each weight shape of the default model (and for all of its weight matmuls back to back, as one
decode step sees them) every candidate is timed in turn within each round, so load from other jobs
hits all candidates alike. Reports per-call medians, the spread (IQR), and each candidate's ratio to
``F.linear`` float32 (median of the per-round ratios).

    .venv/bin/python benchmarks/fastpath.py [--rounds 15] [--threads 2] [--shapes q,down,head,all]

Weights are the model's real ones, cycled over all 30 layers so that, as in decode, they are not
cache-resident (the output head is a single 30 MB matrix and is read once per call).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opscope.engine.core.defaults import default_model_path
from opscope.engine.fastpath.kernels import load_kernels, pack

SHAPES = {
    "q": "attn_q",
    "k": "attn_k",
    "o": "attn_output",
    "gate": "ffn_gate",
    "down": "ffn_down",
    "head": "token_embd",
}


def read_weights(path: Path) -> dict[str, list]:
    import gguf

    reader = gguf.GGUFReader(str(path))
    out: dict[str, list] = {key: [] for key in SHAPES}
    for t in reader.tensors:
        for key, part in SHAPES.items():
            if t.name.endswith(f"{part}.weight") and t.tensor_type.name in ("Q4_1", "Q8_0"):
                n, k = int(t.shape[1]), int(t.shape[0])
                dense = torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type)).reshape(n, k)
                out[key].append((pack(t.tensor_type.name, t.data, (n, k)), dense))
    return out


def candidates(kern, mats: list) -> dict:
    """name → (callable taking x, list of per-matrix operands)."""
    f32 = [dense for _, dense in mats]
    bf16 = [dense.bfloat16() for _, dense in mats]
    packed = [p for p, _ in mats]

    def q(mode, variant):
        def call(x, p):
            kern.set_kernel_variant(variant)  # the same tiny cost for every kernel candidate
            return kern.qlinear(x, p.qs, p.d, p.m, p.qtype, mode, 1 << 30, torch.float32)

        return call

    return {
        "torch_f32": (lambda x, w: F.linear(x, w), f32),
        "torch_bf16": (lambda x, w: F.linear(x.bfloat16(), w).float(), bf16),
        "q_f32act_v1": (q(0, 1), packed),
        "q_f32act": (q(0, 2), packed),
        "q_q8act_v1": (q(1, 1), packed),
        "q_q8act": (q(1, 2), packed),
    }


CLOCK = time.perf_counter  # --clock cpu: time.thread_time (this thread's CPU time; use with --threads 1)


def time_once(fn, operands, x, calls: int) -> float:
    """Seconds per call over ``calls`` calls cycling through ``operands`` (CPU: no sync needed)."""
    t0 = CLOCK()
    for i in range(calls):
        fn(x, operands[i % len(operands)])
    return (CLOCK() - t0) / calls


def run_shape(name: str, cands: dict, k_in: int, rounds: int, calls: int) -> dict[str, list[float]]:
    x = torch.randn(1, k_in)
    for fn, ops in cands.values():  # warm-up, never recorded
        time_once(fn, ops, x, min(calls, len(ops)))
    samples: dict[str, list[float]] = {c: [] for c in cands}
    for r in range(rounds):
        order = list(cands) if r % 2 == 0 else list(reversed(cands))  # A B / B A: no fixed position
        for c in order:
            fn, ops = cands[c]
            samples[c].append(time_once(fn, ops, x, calls))
    return samples


def run_all_weights(cands_by_shape: dict, rounds: int) -> dict[str, list[float]]:
    """One decode step's weight matmuls (every layer's, then the head) back to back, per candidate."""
    names = next(iter(cands_by_shape.values())).keys()
    samples: dict[str, list[float]] = {c: [] for c in names}
    xs = {s: torch.randn(1, ops["torch_f32"][1][0].shape[1]) for s, ops in cands_by_shape.items()}
    for r in range(rounds + 1):
        for c in list(names) if r % 2 == 0 else list(reversed(list(names))):
            t0 = CLOCK()
            for s, ops in cands_by_shape.items():
                fn, mats = ops[c]
                for w in mats:
                    fn(xs[s], w)
            if r:  # round 0 is the warm-up
                samples[c].append(CLOCK() - t0)
    return samples


def report(title: str, samples: dict[str, list[float]], unit_scale: float, unit: str) -> None:
    base = samples["torch_f32"]
    print(f"\n{title}")
    print(f"  {'candidate':<12} {'median':>10} {'IQR':>16} {'ratio vs f32 (median [min-max])':>34}")
    for c, s in samples.items():
        q1, med, q3 = np.percentile(s, [25, 50, 75])
        ratios = [b / v for b, v in zip(base, s)]
        print(
            f"  {c:<12} {med * unit_scale:>8.1f}{unit} [{q1 * unit_scale:6.1f}-{q3 * unit_scale:6.1f}]"
            f" {statistics.median(ratios):>10.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shapes", default="q,k,o,gate,down,head,all")
    ap.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="cpu: the main thread's CPU time, robust to other jobs' load (use --threads 1)",
    )
    args = ap.parse_args()
    global CLOCK
    CLOCK = time.thread_time if args.clock == "cpu" else time.perf_counter
    torch.set_num_threads(args.threads)
    kern = load_kernels()
    weights = read_weights(default_model_path())
    cands = {s: candidates(kern, weights[s]) for s in SHAPES}
    print(
        f"clock={args.clock} threads={args.threads} rounds={args.rounds} avx512={kern.has_avx512()} vnni={kern.has_vnni()}"
    )
    for s in args.shapes.split(","):
        if s == "all":
            continue
        n, k = weights[s][0][0].shape
        samples = run_shape(s, cands[s], k, args.rounds, calls=60 if s != "head" else 6)
        report(f"{s}: {n}x{k} {weights[s][0][0].ggml_type} (per call)", samples, 1e6, "us")
    if "all" in args.shapes.split(","):
        full = {s: cands[s] for s in ("q", "k", "o", "gate", "down", "head")}
        # k/v and gate/up have equal shapes: count k twice and gate twice, as a decode step does.
        full = {**full, "v": cands["k"], "up": cands["gate"]}
        samples = run_all_weights(full, max(3, args.rounds // 3))
        report("all weight matmuls of one decode step", samples, 1e3, "ms")
        print(
            "  implied weights-only tok/s: "
            + ", ".join(f"{c} {1 / statistics.median(s):.0f}" for c, s in samples.items())
        )


if __name__ == "__main__":
    main()
