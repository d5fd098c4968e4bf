"""Decode tok/s of every given backend on the default model, interleaved.

    .venv/bin/python benchmarks/backends_decode.py --backends torch mlx --rounds 7 --tokens 32

Backends take turns within each round (A B A B ...), so a neighbour's load hits both alike; the
per-round ratio is reported next to the ratio of medians. Warm-up generations are not counted.
decode tok/s = (n - 1) / (t_last_token - t_first_token), from the engine's own Token events.
"""

from __future__ import annotations

import argparse
import json
import statistics

from opscope.engine.backends import get_backend
from opscope.engine.generation.events import Finished
from opscope.engine.generation.generate import GenerationConfig

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def decode_tok_s(model, tokens: int) -> float:
    cfg = GenerationConfig(max_tokens=tokens, ignore_eos=True)
    *_, fin = model.generate(PROMPT, cfg)
    assert isinstance(fin, Finished) and fin.stats.generated_tokens == tokens
    return fin.stats.decode_tok_s


def spread(xs: list[float]) -> str:
    q = statistics.quantiles(xs, n=4) if len(xs) >= 2 else [xs[0]] * 3
    return f"median {statistics.median(xs):7.2f}  IQR {q[0]:.2f}–{q[2]:.2f}  min–max {min(xs):.2f}–{max(xs):.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backends", nargs="+", default=["torch", "mlx"])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--json", default=None, help="write raw samples here")
    args = ap.parse_args()
    models = {b: get_backend(b).load(None, device="cpu", dtype="float32") for b in args.backends}
    for m in models.values():
        decode_tok_s(m, 8)  # warm-up: allocators, caches, lazy init
    samples: dict[str, list[float]] = {b: [] for b in models}
    for r in range(args.rounds):
        order = list(models) if r % 2 == 0 else list(reversed(models))  # alternate who goes first
        for b in order:
            samples[b].append(decode_tok_s(models[b], args.tokens))
    for b, xs in samples.items():
        print(f"{b:>6} decode tok/s  {spread(xs)}  (n={len(xs)}, tg{args.tokens})")
    if len(models) == 2:
        a, b = list(models)
        ratios = [y / x for x, y in zip(samples[a], samples[b])]
        print(
            f"{b}/{a}: ratio of medians {statistics.median(samples[b]) / statistics.median(samples[a]):.2f}, "
            f"per-round ratios {spread(ratios)}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tokens": args.tokens, "samples": samples}, f, indent=2)


if __name__ == "__main__":
    main()
