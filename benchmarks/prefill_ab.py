"""Prefill A/B: the panel-decoded GEMM (prefill.cpp) against the older dequantize-tile path and
llama.cpp's llama-bench, interleaved, on files of each GGUF type.

    .venv/bin/python benchmarks/prefill_ab.py [--types Q4_0,Q6_K] [--rounds 3] [--threads 2] [--pp 512]

Per type and round (the order rotates every round): ``llama-bench -p PP -n 0 -t T -r 3``, then
OpScope in a fresh process per variant (``new``: the default fast path; ``old``: qlinear's older
dequantize-whole-tile + at::linear path, the unfused MLP, torch's RMSNorm, RoPE and SDPA), each timing ``model(toks, 0,
last_only=True)`` over PP tokens, best of 3 after a warm-up. Prints per type the median tok/s of
each and the median of the per-round ratios, with ``uptime`` load before and after (the machine is
shared: ratios within a round are the figure to trust, absolute tok/s are not). ``--in-process``:
the fused RMSNorm/attention kernels on and off in one process, CPU time per pass. Files come from
benchmarks/gguf_types.py's cache (made there with llama-quantize when missing).
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

BELOW_BAR = "Q4_0,Q2_K,Q3_K_M,Q6_K,IQ4_NL,IQ4_XS"


def child(path: str, variant: str, pp: int, threads: int, reps: int) -> int:
    import torch

    torch.set_num_threads(threads)
    from opscope.engine.api import load

    lm = load(path, threads=threads)
    model = lm.model
    if variant == "old":
        from opscope.engine.fastpath.qlinear import install_prefill_kernels

        torch.ops.opscope.prefill_config(-1, -1, 0)
        _unfuse_mlps(model)
        install_prefill_kernels(model, False)
    model.setup_cache(1, pp)
    toks = torch.randint(0, lm.config.vocab_size, (1, pp), generator=torch.Generator().manual_seed(2))
    times = []
    with torch.inference_mode():
        model(toks, 0, last_only=True)
        for _ in range(reps):
            t0 = time.perf_counter()
            model(toks, 0, last_only=True)
            times.append(time.perf_counter() - t0)
    print(json.dumps({"tok_s": pp / min(times), "all": [pp / t for t in times]}))
    return 0


def in_process(path: str, pp: int, threads: int, rounds: int) -> int:
    """One model, the fused prefill kernels (one-pass RMSNorm, opscope::prefill_attn) switched on and
    off between passes: per variant the median over rounds of wall and process CPU time (CPU time
    counts both threads: less sensitive to other processes on a shared machine than wall time)."""
    import torch
    from opscope.engine.api import load
    from opscope.engine.fastpath.qlinear import install_prefill_kernels

    torch.set_num_threads(threads)
    lm = load(path, threads=threads)
    model = lm.model
    model.setup_cache(1, pp)
    toks = torch.randint(0, lm.config.vocab_size, (1, pp), generator=torch.Generator().manual_seed(2))
    wall: dict[str, list[float]] = {"fused": [], "torch": []}
    cpu: dict[str, list[float]] = {"fused": [], "torch": []}
    with torch.inference_mode():
        for r in range(rounds + 1):
            for variant in ("fused", "torch") if r % 2 else ("torch", "fused"):
                install_prefill_kernels(model, variant == "fused")
                t0, c0 = time.perf_counter(), time.process_time()
                model(toks, 0, last_only=True)
                if r:  # round 0 warms both up
                    wall[variant].append(time.perf_counter() - t0)
                    cpu[variant].append(time.process_time() - c0)
    for v in wall:
        w, c = statistics.median(wall[v]), statistics.median(cpu[v])
        print(
            f"{Path(path).name} {v:6s}: wall {pp / w:6.1f} tok/s [{pp / max(wall[v]):.0f}-{pp / min(wall[v]):.0f}], "
            f"CPU {c * 1e3:7.1f} ms per pass"
        )
    ratio = [a / b for a, b in zip(cpu["torch"], cpu["fused"])]
    print(
        f"  CPU time torch/fused per round: median {statistics.median(ratio):.3f} [{min(ratio):.3f}-{max(ratio):.3f}]"
        f"; load {os.getloadavg()}"
    )
    return 0


def _unfuse_mlps(model) -> None:
    """The MLPs as before prefill.cpp: gate and up as separate GEMMs, the activation on their outputs."""
    import types

    import torch.nn.functional as F

    def forward(self, x):
        g = self.gate_proj(x)
        return self.down_proj((F.gelu(g, approximate="tanh") if self.gelu else F.silu(g)) * self.up_proj(x))

    for layer in model.layers:
        layer.mlp.forward = types.MethodType(forward, layer.mlp)


def run_opscope(path: Path, variant: str, pp: int, threads: int, reps: int) -> float | None:
    argv = [
        sys.executable,
        __file__,
        "--child",
        str(path),
        "--variant",
        variant,
        "--pp",
        str(pp),
        "--threads",
        str(threads),
        "--reps",
        str(reps),
    ]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"  opscope {variant} failed: {proc.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])["tok_s"]


def run_llama(path: Path, pp: int, threads: int) -> float | None:
    from opscope.engine.bench.peers import llama_bench

    from benchmarks.gguf_types import TOOLS

    try:
        r = llama_bench.run(TOOLS / "llama-bench", path, pp, 0, threads, reps=3)
    except RuntimeError as e:
        print(f"  llama-bench failed: {e}", file=sys.stderr)
        return None
    return pp / r.pp_s[0] if r.pp_s else None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--types", default=BELOW_BAR)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--variants", default="new,old")
    ap.add_argument("--no-llama", action="store_true")
    ap.add_argument(
        "--in-process",
        action="store_true",
        help="one process per type: fused prefill kernels on/off between passes (CPU time A/B)",
    )
    ap.add_argument("--child")
    ap.add_argument("--variant", default="new")
    args = ap.parse_args(argv)
    if args.child:
        return child(args.child, args.variant, args.pp, args.threads, args.reps)

    from opscope.engine.core.defaults import default_model_path

    from benchmarks.gguf_types import CACHE, quantize

    if args.in_process:
        for kind in [t.strip().upper() for t in args.types.split(",") if t.strip()]:
            in_process(
                str(quantize(default_model_path(), kind, CACHE, args.threads)), args.pp, args.threads, args.rounds
            )
        return 0
    who = [v.strip() for v in args.variants.split(",") if v.strip()] + ([] if args.no_llama else ["llama"])
    print(f"load before: {os.getloadavg()}")
    for kind in [t.strip().upper() for t in args.types.split(",") if t.strip()]:
        path = quantize(default_model_path(), kind, CACHE, args.threads)
        got: dict[str, list[float]] = {w: [] for w in who}
        ratios: dict[str, list[float]] = {w: [] for w in who if w != "llama"}
        for r in range(args.rounds):
            order = who[r % len(who) :] + who[: r % len(who)]
            one = {
                w: (
                    run_llama(path, args.pp, args.threads)
                    if w == "llama"
                    else run_opscope(path, w, args.pp, args.threads, args.reps)
                )
                for w in order
            }
            for w, v in one.items():
                if v is not None:
                    got[w].append(v)
            for w in ratios:
                if one.get(w) and one.get("llama"):
                    ratios[w].append(one[w] / one["llama"])
            print(
                f"{kind} round {r + 1}: "
                + ", ".join(f"{w} {v:.0f}" for w, v in one.items() if v)
                + f"  (load {os.getloadavg()[0]:.1f})",
                flush=True,
            )
        med = {w: statistics.median(v) for w, v in got.items() if v}
        line = f"{kind}: " + ", ".join(f"{w} {v:.0f} tok/s" for w, v in med.items())
        for w, v in ratios.items():
            if v:
                line += f"; {w}/llama {statistics.median(v):.2f} [{min(v):.2f}-{max(v):.2f}]"
        print(line, flush=True)
    print(f"load after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
