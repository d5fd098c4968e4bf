"""Engine core benchmark (issue 2): pp512 and tg128 with llama-bench semantics on the default model,
for float32 and bfloat16, against the matmul-only ceiling measured in the same run.

    .venv/bin/python benchmarks/engine_bench.py [--reps 5] [--threads 2] [--compile off,decode]
                                                [--out engine_bench.json]

pp512: 512 random prompt tokens in one forward pass, tok/s (prefill through the engine's generate).
tg128: 128 tokens generated one at a time (EOS ignored) through the engine's generate, tok/s from its
own events. Ceiling: every weight matmul of the model (q, k, v, o, gate, up, down × layers + output
head) at batch 1 on the model's own weights, back to back — what decode would reach with zero
framework overhead. Variants (dtype × compile setting) are interleaved so machine noise hits all.
``--compile decode`` runs the decode step through torch.compile (engine.models.compiled); its
warm-up includes the compile.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from opscope.engine.api import load
from opscope.engine.generation.events import Finished, PrefillFinished, PrefillStarted
from opscope.engine.generation.generate import GenerationConfig, decode_threads


def matmul_ceiling_tok_s(lm, reps: int = 20) -> list[float]:
    """tok/s of all weight matmuls of one decode step, run back to back (batch 1)."""
    weights = [m.weight for m in lm.model.modules() if isinstance(m, torch.nn.Linear)]
    inputs = [torch.randn(1, 1, w.shape[1], dtype=w.dtype) for w in weights]
    out = []
    with torch.inference_mode(), decode_threads(lm.model):  # the same threads decode runs with
        for _ in range(3):
            for x, w in zip(inputs, weights):
                F.linear(x, w)
        for _ in range(reps):
            t = time.perf_counter()
            for x, w in zip(inputs, weights):
                F.linear(x, w)
            out.append(1.0 / (time.perf_counter() - t))
    return out


def pp(lm, n: int, gen: torch.Generator) -> float:
    ids = torch.randint(100, lm.config.vocab_size, (n,), generator=gen).tolist()
    ev = {type(e): e for e in lm.generate(ids, GenerationConfig(max_tokens=1, ignore_eos=True, prefill_chunk=n))}
    return n / ((ev[PrefillFinished].t_ns - ev[PrefillStarted].t_ns) / 1e9)


def tg(lm, n: int) -> float:
    done = [e for e in lm.generate([1], GenerationConfig(max_tokens=n + 1, ignore_eos=True))][-1]
    assert isinstance(done, Finished)
    return done.stats.decode_tok_s  # n tokens after the first, over their own time


def summary(xs: list[float]) -> dict:
    q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
    return {"median": statistics.median(xs), "p25": q[0], "p75": q[2], "min": min(xs), "max": max(xs), "samples": xs}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="engine_bench.json")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--compile", default="off,decode", help="compile settings to run (off, decode)")
    ap.add_argument(
        "--fastpath",
        default="off",
        help="engine.api.load's fast-path setting (this script "
        "measures the plain torch engine against its matmul ceiling by default)",
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    models, load_ms = {}, {}
    for dt in args.dtypes.split(","):
        for comp in args.compile.split(","):
            key = dt if comp == "off" else f"{dt}+compile"
            models[key] = load(dtype=dt, threads=args.threads, fastpath=args.fastpath, compile=comp)
            load_ms[key] = [models[key].load_ms]
    for key, lm in models.items():  # warm-up: allocator, caches, thread pool, the compile
        t = time.perf_counter()
        pp(lm, 512, gen), tg(lm, 8)  # the measured shapes (cache sizes), so no compile lands in a rep
        print(f"warm-up {key}: {time.perf_counter() - t:.1f} s", flush=True)
    res = {dt: {"pp512": [], "tg128": [], "ceiling": []} for dt in models}
    for _ in range(args.reps):
        for dt, lm in models.items():
            res[dt]["pp512"].append(pp(lm, 512, gen))
            res[dt]["tg128"].append(tg(lm, 128))
            res[dt]["ceiling"].append(statistics.median(matmul_ceiling_tok_s(lm)))
    for key, lm in models.items():  # load time: a fresh load per repetition, after the rest
        for _ in range(2):
            load_ms[key].append(load(dtype=lm.options.dtype, threads=args.threads, fastpath=args.fastpath).load_ms)
    report = {
        "threads": args.threads,
        "reps": args.reps,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "dtypes": {},
    }
    print(
        f"{'variant':16} {'pp512 tok/s':>14} {'tg128 tok/s':>14} {'ceiling tok/s':>14} {'tg/ceiling':>10} {'load ms':>9}"
    )
    for dt, r in res.items():
        ratio = [a / b for a, b in zip(r["tg128"], r["ceiling"])]
        d = {k: summary(v) for k, v in r.items()} | {"tg_over_ceiling": summary(ratio), "load_ms": summary(load_ms[dt])}
        report["dtypes"][dt] = d
        print(
            f"{dt:16} {_fmt(d['pp512'])} {_fmt(d['tg128'])} {_fmt(d['ceiling'])} "
            f"{d['tg_over_ceiling']['median']:>10.2f} {d['load_ms']['median']:>9.0f}"
        )
    print(f"peak RSS {report['peak_rss_bytes'] / 2**20:.0f} MiB (all models of this run together)")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    return 0


def _fmt(s: dict) -> str:
    return f"{s['median']:>7.1f} ±{(s['p75'] - s['p25']) / 2:>5.1f}"


if __name__ == "__main__":
    sys.exit(main())
