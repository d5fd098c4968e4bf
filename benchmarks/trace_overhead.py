"""What tracing costs: decode tok/s traced vs untraced on the default model, and µs per traced op.

Two measurements, every variant interleaved within each round (so load from other jobs hits all
variants alike), medians and min..max over rounds, ratios to the untraced baseline:

1. Decode: the default model (CPU, float32) generates ``--tokens`` tokens (EOS ignored) through the
   engine's own loop; decode tok/s from the engine's Finished stats. Overhead per traced op =
   (traced decode step time - untraced) / ops per decode step.
2. Per op: ``--ops`` tiny additions (1×16 float32) in a loop, so the op itself costs ~1 µs and the
   trace's cost dominates. An empty TorchDispatchMode is the floor any dispatch-mode trace pays.

Variants: source lines off / only for off-target ops ("findings", the default) / for every op;
module hooks per model vs global; the garbage-collector pause off.

    .venv/bin/python benchmarks/trace_overhead.py [--rounds 5] [--tokens 16] [--ops 5000] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install

from engine.trace.capture import Tracer  # noqa: E402
from engine.trace.events import TraceOptions  # noqa: E402

VARIANTS = {  # name → TraceOptions (None: untraced)
    "untraced": None,
    "source=off": TraceOptions(source="off"),
    "source=findings": TraceOptions(source="findings"),
    "source=all": TraceOptions(source="all"),
    "hooks=global": TraceOptions(hooks="global"),
    "gc not paused": TraceOptions(pause_gc=False),
}


class _Empty(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _decode_once(lm, options: TraceOptions | None, tokens: int) -> tuple[float, float]:
    """(decode tok/s, ops per decode step) of one generation."""
    from engine.generate import GenerationConfig
    from engine.trace.session import trace_generation

    config = GenerationConfig(max_tokens=tokens, ignore_eos=True)
    if options is None:
        *_, finished = lm.generate("The capital of France is", config)
        return finished.stats.decode_tok_s, float("nan")
    run = trace_generation(lm, "The capital of France is", config, options)
    decode_steps = [s.ops for step, s in run.result.stats.steps.items() if 1 <= step < tokens]
    return run.finished.stats.decode_tok_s, statistics.fmean(decode_steps)


def bench_decode(rounds: int, tokens: int) -> dict:
    from engine.api import load

    lm = load()
    _decode_once(lm, None, 4)  # warm-up: caches, lazy inits
    samples = {name: [] for name in VARIANTS}
    ops = []
    for r in range(rounds):
        order = list(VARIANTS)[r % len(VARIANTS):] + list(VARIANTS)[:r % len(VARIANTS)]
        for name in order:
            tok_s, n_ops = _decode_once(lm, VARIANTS[name], tokens)
            samples[name].append(tok_s)
            if name == "source=findings":
                ops.append(n_ops)
    return {"tok_s": samples, "ops_per_step": statistics.median(ops)}


def _op_loop(n: int) -> None:
    x = torch.randn(1, 16)
    for _ in range(n):
        torch.add(x, x)


def _time_ops(mode, n: int) -> float:
    """Seconds per op of the loop under ``mode`` (None: no mode)."""
    if mode is None:
        t0 = time.perf_counter()
        _op_loop(n)
        return (time.perf_counter() - t0) / n
    with mode:
        t0 = time.perf_counter()
        _op_loop(n)
        return (time.perf_counter() - t0) / n


def bench_ops(rounds: int, n: int) -> dict:
    makers = {"no mode": lambda: None, "empty dispatch mode": _Empty}
    makers |= {name: (lambda o=opts: Tracer(o)) for name, opts in VARIANTS.items() if opts is not None}
    _time_ops(Tracer(TraceOptions()), 200)  # warm-up
    samples = {name: [] for name in makers}
    for _ in range(rounds):
        for name, make in makers.items():
            samples[name].append(_time_ops(make(), n) * 1e6)
    return samples


def _summary(values: list[float]) -> str:
    return f"{statistics.median(values):8.2f}  ({min(values):.2f}..{max(values):.2f})"


def print_results(decode: dict | None, ops: dict) -> None:
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("\nPer op (tiny add loop), µs per op: median (min..max)   overhead vs no mode")
    base = statistics.median(ops["no mode"])
    for name, values in ops.items():
        print(f"  {name:<22} {_summary(values)}   +{statistics.median(values) - base:.2f}")
    if decode is None:
        return
    tok = decode["tok_s"]
    base_tok = statistics.median(tok["untraced"])
    n_ops = decode["ops_per_step"]
    print(f"\nDecode, default model (CPU, float32), {n_ops:.0f} ops per decode step: tok/s median (min..max)")
    for name, values in tok.items():
        med = statistics.median(values)
        extra_us = (1 / med - 1 / base_tok) * 1e6 / n_ops if name != "untraced" else 0.0
        print(f"  {name:<22} {_summary(values)}   ratio {med / base_tok:.2f}   +{extra_us:.1f} µs/op")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--ops", type=int, default=5000)
    p.add_argument("--skip-decode", action="store_true", help="only the per-op loop (no model)")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    ops = bench_ops(args.rounds, args.ops)
    decode = None if args.skip_decode else bench_decode(args.rounds, args.tokens)
    print_results(decode, ops)
    if args.json:
        args.json.write_text(json.dumps({"ops_us": ops, "decode": decode}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
