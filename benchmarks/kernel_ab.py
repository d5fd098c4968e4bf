"""A/B of two builds of the kernel library: ps per weight of one matvec per type, interleaved.

    OPSCOPE_CPU_VARIANT=avx2 python benchmarks/kernel_ab.py OLD.so NEW.so --act q8 --out benchmarks/results/NAME

Each side runs in its own process (both register the same torch operators), alternating A, B, A, B
for ``--pairs`` pairs; each process times ``--reps`` calls per type on one 2048 x 4096 matrix of
random blocks (scales kept finite) and keeps its best. That matrix (2-9 MB) stays in the caches, so
it measures the arithmetic; ``--copies N`` times N such matrices one after another instead (a
model's matvecs, read from memory: 24 copies of Q4_K are 113 MB). The table gives each side's minimum and
median over the pairs and the median of the pairwise B/A ratios: on a shared host whose speed
swings with its neighbours the minima are the comparable figures. The result file records the
CPU's flags (lscpu) and the load before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gguf_types import host_meta, loadavg

TYPES = "Q4_0,Q4_1,Q5_0,Q5_1,Q8_0,IQ4_NL,Q2_K,Q3_K,Q4_K,Q5_K,Q6_K,IQ4_XS"
N, K = 2048, 4096


def child(lib: str, types: list[str], act: int, reps: int, threads: int, copies: int) -> dict[str, float]:
    import gguf
    import numpy as np
    import torch
    from opscope.engine.fastpath.kernels import pack

    torch.ops.load_library(lib)
    torch.set_num_threads(threads)
    rng = np.random.default_rng(0)
    mats = {}
    for ty in types:
        block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[ty]]
        raw = rng.integers(0, 256, size=N * K // block * size, dtype=np.uint8)
        raw.view(np.uint16)[:] &= 0x3BFF  # every fp16 a finite value below 1
        mats[ty] = [pack(ty, raw.copy(), (N, K)) for _ in range(copies)]  # distinct memory
    x = torch.randn(1, K)
    best = dict.fromkeys(types, float("inf"))
    for _ in range(reps):
        for ty in types:
            t0 = time.perf_counter()
            for p in mats[ty]:
                torch.ops.opscope.qlinear(x, p.qs, p.d, p.m, p.qtype, act, 1 << 30, 0)
            best[ty] = min(best[ty], time.perf_counter() - t0)
    return {ty: best[ty] / (N * K * copies) * 1e12 for ty in types}


def run_side(lib: str, args: argparse.Namespace) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--child", lib, "--types", args.types, "--act", args.act]
    cmd += ["--reps", str(args.reps), "--threads", str(args.threads), "--copies", str(args.copies)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def markdown(res: dict) -> str:
    meta = res["meta"]
    lines = [
        f"# Kernel A/B: {res['a']} (A) vs {res['b']} (B)\n",
        f"Activations {res['act']}, {res['threads']} thread(s), {res['pairs']} interleaved pairs, "
        f"{res.get('copies', 1)} matrix(es) of {N} x {K} per type; ps per weight (lower is faster).\n",
        f"CPU: {meta.get('cpu', '?')}; variant {os.environ.get('OPSCOPE_CPU_VARIANT', 'auto')}; "
        f"load before {res['load_before']}, after {res['load_after']}.\n",
        "| type | A min | A median | B min | B median | B/A of minima | B/A pairwise median (range) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for ty, r in res["types"].items():
        a, b = r["a"], r["b"]
        ratios = [y / x for x, y in zip(a, b)]
        lines.append(
            f"| {ty} | {min(a):.1f} | {statistics.median(a):.1f} | {min(b):.1f} | {statistics.median(b):.1f} "
            f"| {min(b) / min(a):.2f} | {statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f}) |"
        )
    lines.append(f"\nlscpu flags: `{meta.get('cpu_flags', '?')}`\n")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", nargs="?", help="library A (.so)")
    ap.add_argument("b", nargs="?", help="library B (.so)")
    ap.add_argument("--types", default=TYPES)
    ap.add_argument("--act", choices=["f32", "q8"], default="f32")
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--reps", type=int, default=12, help="calls per type in each process (best kept)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--copies", type=int, default=1, help="matrices per type, timed in turn (many: from memory)")
    ap.add_argument("--out", help="write OUT.json and OUT.md")
    ap.add_argument("--child", metavar="LIB", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    types = args.types.split(",")
    act = 1 if args.act == "q8" else 0
    if args.child:
        print(json.dumps(child(args.child, types, act, args.reps, args.threads, args.copies)))
        return 0
    if not (args.a and args.b):
        ap.error("give two libraries, A and B")
    res = {"a": args.a, "b": args.b, "act": args.act, "threads": args.threads, "pairs": args.pairs}
    res["copies"] = args.copies
    res["meta"], res["load_before"] = host_meta(), loadavg()
    res["types"] = {ty: {"a": [], "b": []} for ty in types}
    for _ in range(args.pairs):
        for side, lib in (("a", args.a), ("b", args.b)):
            for ty, ps in run_side(lib, args).items():
                res["types"][ty][side].append(ps)
    res["load_after"] = loadavg()
    text = markdown(res)
    print(text)
    if args.out:
        Path(args.out + ".json").write_text(json.dumps(res, indent=1))
        Path(args.out + ".md").write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
