"""The ceilings of prefill on this CPU, exact float32 and int8, against what pp ≥ 1.5× llama.cpp asks.

    .venv/bin/python benchmarks/prefill_ceiling.py [--model FILE.gguf] [--pp 512] [--threads 2]
        [--results benchmarks/results/gguf_types.json] [--out benchmarks/results/prefill_ceiling.md]

Measures, on one thread and in CPU time (``time.thread_time``: robust to other processes on a
shared machine), torch's float32 GEMM (MKL) for each weight shape of the model at M = pp rows, and
SDPA's causal attention for pp tokens; then the best pp achievable in float32 with ``--threads``
cores that scale perfectly: weight FLOPs at the measured GEMM rate plus attention at SDPA's rate
(norms, RoPE and residual adds left out: the ceiling is generous). llama.cpp's pp per type comes
from benchmarks/results/gguf_types.json (the last quiet run), the bar being 1.5× that.

With g++ on x86-64, also the arithmetic ceilings of one AVX2 core (benchmarks/arith_peak.cpp, the
best of 3 runs): float32 FMA, and int8 dot products as an AVX2 core has them, u8 × s8 (maddubs +
madd: quants of at most 7 bits, unsigned) and s8 × s8 (the sign trick: Q8_0 and the IQ4 tables).
The int8 ceiling of a type puts its weights' multiply-adds at that rate (no scales, conversions,
quantization or panel decoding: generous too) plus SDPA's attention. Run it with the stand-in's caps
(ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2) for an AVX2 CPU.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

# the weights' dot product a type's int8 prefill GEMM runs on AVX2 (rowwork.cpp: int8_quant_bits)
SIGNED8 = {"Q8_0", "IQ4_NL", "IQ4_XS"}
FLOAT = {"F16", "BF16", "F32"}


def arith_peaks(rounds: int = 3) -> dict[str, float] | None:
    """GMAC/s of one core: float32 FMA ("f"), u8 x s8 ("u"), s8 x s8 by the sign trick ("s")."""
    if platform.machine() not in ("x86_64", "AMD64") or shutil.which("g++") is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "arith_peak"
        src = REPO / "benchmarks" / "arith_peak.cpp"
        subprocess.run(["g++", "-O3", "-funroll-all-loops", "-march=x86-64-v3", "-o", str(exe), str(src)], check=True)
        best: dict[str, float] = {}
        for _ in range(rounds):
            for kind in "fus":
                out = subprocess.run([str(exe), "100000000", kind], capture_output=True, text=True, check=True)
                best[kind] = max(best.get(kind, 0.0), float(out.stdout.split()[1]))
    return best


def weight_class(tensor_types: dict[str, int]) -> str:
    """The dot product most of a file's weight matrices take: "f" (float), "s" (signed 8-bit), "u"."""
    main = max((t for t in tensor_types if t != "F32"), key=lambda t: tensor_types[t], default="F32")
    return "f" if main in FLOAT else "s" if main in SIGNED8 else "u"


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
    ap.add_argument("--out", help="a markdown result file (lscpu flags and load in it)")
    args = ap.parse_args(argv)
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    load0 = " ".join(Path("/proc/loadavg").read_text().split()[:3])

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
    lines = [
        f"weights' GEMMs: {L * flops / M / 1e6:.1f} MFLOP per token, MKL at {flops / gemm_s / 1e9:.1f} GFLOP/s "
        f"per core; SDPA: {L * attn_flops / M / 1e6:.1f} MFLOP per token at {attn_flops / t_attn / 1e9:.1f} GFLOP/s",
        f"float32 ceiling ({args.threads} perfectly scaling cores): {ceiling:.0f} tok/s",
    ]
    peaks = arith_peaks()
    ceilings = {"f": ceiling}
    if peaks:
        lines.append(
            "one core's arithmetic (arith_peak.cpp, GMAC/s): float32 FMA {f:.1f}, int8 u8 x s8 {u:.1f}, "
            "s8 x s8 (sign trick) {s:.1f}".format(**peaks)
        )
        macs = flops / 2  # per layer, M tokens
        for kind in "us":
            ceilings[kind] = M / (L * (macs / (peaks[kind] * 1e9) + t_attn) / args.threads)
        lines.append(
            f"int8 ceilings: u8 weights {ceilings['u']:.0f} tok/s, signed 8-bit weights {ceilings['s']:.0f} tok/s"
        )
    print("\n".join(lines[-2:] if peaks else lines[-1:]))
    path = Path(args.results)
    rows = []
    if path.is_file():
        data = json.loads(path.read_text())
        head = (
            "| type | weights | llama pp | bar (1.5×) | float32 ceiling | ÷ bar | int8 ceiling | ÷ bar | OpScope pp |"
        )
        rows = [head, "|" + "---|" * 9]
        for rec in data["types"]:
            summ = rec.get("summary", {})
            med = (summ.get("pp_llama") or {}).get("median")
            ours = (summ.get("pp_opscope") or {}).get("median")
            if not med:
                continue
            bar, kind = 1.5 * med, weight_class(rec.get("tensor_types", {}))
            i8 = ceilings.get(kind) if kind != "f" else None
            rows.append(
                f"| {rec['type']} | {dict(f='float', s='signed 8-bit', u='u8')[kind]} | {med:.0f} | {bar:.0f} | "
                f"{ceiling:.0f} | {ceiling / bar:.2f} | {f'{i8:.0f}' if i8 else '–'} | "
                f"{f'{i8 / bar:.2f}' if i8 else '–'} | {ours:.0f} |"
            )
        print(f"\nbar = 1.5 x llama.cpp pp{M} ({path.name}); ceiling ÷ bar < 1: the bar is out of reach")
        print("\n".join(rows))
    if args.out:
        from gguf_types import host_meta

        meta = host_meta()
        text = [
            f"# Prefill ceilings: {Path(args.model or default_model_path()).name}, pp{M}, {args.threads} threads",
            "",
            f"Started {started} UTC; load average before {load0}, after {' '.join(Path('/proc/loadavg').read_text().split()[:3])}.",
            f"CPU: {meta.get('cpu')}; caps: {meta.get('stand_in', 'none (native)')}; llama.cpp figures: {path.name}.",
            "",
            *[f"- {ln}" for ln in lines],
            "",
            *rows,
            "",
            f"lscpu flags: `{meta.get('cpu_flags', '?')}`",
        ]
        Path(args.out).write_text("\n".join(text) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
