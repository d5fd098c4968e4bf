"""The exact-float32 ceiling of prefill on this CPU, against what pp ≥ 1.5× llama.cpp asks per type.

    .venv/bin/python benchmarks/prefill_ceiling.py [--model FILE.gguf] [--pp 512] [--threads 2]

Measures, on one thread and in CPU time (``time.thread_time``: robust to other processes on a
shared machine), torch's float32 GEMM (MKL) for each weight shape of the model at M = pp rows, and
SDPA's causal attention for pp tokens; then the best pp achievable in float32 with ``--threads``
cores that scale perfectly: weight FLOPs at the measured GEMM rate plus attention at SDPA's rate
(norms, RoPE and residual adds left out: the ceiling is generous). llama.cpp's pp per type comes
from benchmarks/results/gguf_types.json (the last quiet run), the bar being 1.5× that.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def cpu_time(f, n: int = 8, rounds: int = 4) -> float:
    f()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.thread_time()
        for _ in range(n):
            f()
        best = min(best, (time.thread_time() - t0) / n)
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model")
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--results", default=str(REPO / "benchmarks" / "results" / "gguf_types.json"))
    args = ap.parse_args(argv)

    import torch
    import torch.nn.functional as F
    from opscope.engine.core.defaults import default_model_path
    from opscope.engine.formats.gguf_source import GGUFSource

    torch.set_num_threads(1)
    cfg = GGUFSource(Path(args.model or default_model_path())).config
    M, C, Hd = args.pp, cfg.dim, cfg.n_heads * cfg.head_dim
    kv = cfg.n_kv_heads * cfg.head_dim
    shapes = {
        "q": (Hd, C),
        "k": (kv, C),
        "v": (kv, C),
        "o": (C, Hd),
        "gate": (cfg.hidden_dim, C),
        "up": (cfg.hidden_dim, C),
        "down": (C, cfg.hidden_dim),
    }
    gemm_s, flops = 0.0, 0.0
    print(f"float32 GEMM, 1 thread, M={M} (CPU time):")
    for name, (n, k) in shapes.items():
        x, w = torch.randn(M, k), torch.randn(n, k)
        t = cpu_time(lambda x=x, w=w: F.linear(x, w))
        f = 2.0 * M * n * k
        gemm_s, flops = gemm_s + t, flops + f
        print(f"  {name:5s} N={n:5d} K={k:5d}: {t * 1e3:7.3f} ms  {f / t / 1e9:6.1f} GFLOP/s")
    q = torch.randn(1, cfg.n_heads, M, cfg.head_dim)
    k = torch.randn(1, cfg.n_kv_heads, M, cfg.head_dim)
    t_attn = cpu_time(lambda: F.scaled_dot_product_attention(q, k, k, is_causal=True, enable_gqa=True))
    attn_flops = 4.0 * cfg.n_heads * cfg.head_dim * M * (M + 1) / 2
    L = cfg.n_layers
    print(f"  SDPA causal T={M}: {t_attn * 1e3:.3f} ms per layer, {attn_flops / t_attn / 1e9:.1f} GFLOP/s")
    per_pass = L * (gemm_s + t_attn) / args.threads
    print(
        f"per token: {L * flops / M / 1e6:.1f} MFLOP weights + {L * attn_flops / M / 1e6:.1f} MFLOP attention; "
        f"GEMM rate {flops / gemm_s / 1e9:.1f} GFLOP/s per core"
    )
    ceiling = M / per_pass
    weights_only = M / (L * gemm_s / args.threads)
    print(
        f"ceiling, {args.threads} perfectly scaling cores: {ceiling:.0f} tok/s "
        f"(weights' GEMMs alone: {weights_only:.0f} tok/s)"
    )
    path = Path(args.results)
    if path.is_file():
        data = json.loads(path.read_text())
        print(f"\nbar = 1.5 x llama.cpp pp{M} ({path.name}); headroom = ceiling / bar:")
        for rec in data["types"]:
            s = rec.get("summary", {}).get("pp_llama")
            med = s["median"] if isinstance(s, dict) else (s[0] if s else None)
            if med:
                print(
                    f"  {rec['type']:7s} llama {med:6.0f}  bar {1.5 * med:6.0f}  headroom {ceiling / (1.5 * med):.2f}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
