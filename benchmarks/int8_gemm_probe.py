"""How fast can an int8 prefill GEMM be here? A VNNI microkernel with llama.cpp's per-32 scales
(int8_gemm_probe.cpp) against torch's bfloat16 and float32 GEMMs (oneDNN, MKL), one thread.

    .venv/bin/python benchmarks/int8_gemm_probe.py [--rounds 5] [--out benchmarks/results/int8_gemm_probe.md]

benchmarks/int8_prefill_probe.py measured the int8 route through a library GEMM (torch._int_mm, one
call per group of K) and found it slower than bf16. A kernel that keeps each group's scales inside
the loop, as llama.cpp's repacked GEMMs do, is the fair test: 16 output rows per zmm, 4 tokens by
48 rows per tile, 8 vpdpbusd per group of 32, then one convert and two FMAs per (token, 16 rows).
The weights are already in the kernel's layout (a real prefill decodes each panel first) and the
activations already quantized: this is the GEMM's ceiling, not a prefill's. Needs g++ and
AVX-512 VNNI. Rounds interleave the three; medians and spread per shape; lscpu flags and load in
the result file.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from gguf_types import host_meta, loadavg  # noqa: E402

# (name, N, K) at M = 512 prompt tokens: SmolLM2-135M's linears and the synthetic 1.1B Llama's
SHAPES = [
    ("135M q/o", 576, 576),
    ("135M gate/up", 1536, 576),
    ("135M down", 576, 1536),
    ("1B q/o", 2048, 2048),
    ("1B gate/up", 5632, 2048),
    ("1B down", 2048, 5632),
]
M = 512


def build(tmp: Path) -> Path:
    exe = tmp / "int8_gemm_probe"
    src = REPO / "benchmarks" / "int8_gemm_probe.cpp"
    subprocess.run(["g++", "-O3", "-march=native", "-o", str(exe), str(src)], check=True, timeout=120)
    return exe


def int8_ms(exe: Path, n: int, k: int, reps: int) -> tuple[float, float]:
    out = subprocess.run([str(exe), str(M), str(n), str(k), str(reps)], capture_output=True, text=True, timeout=120)
    _best, median, err = out.stdout.split()
    return float(median), float(err)


def torch_ms(dtype, n: int, k: int, reps: int) -> float:
    import torch

    a, b = torch.randn(M, k).to(dtype), torch.randn(n, k).to(dtype)
    a @ b.T
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b.T
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks/results/int8_gemm_probe.md")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    res: dict = {"host": host_meta(), "load_before": loadavg(), "m": M, "rounds": args.rounds, "shapes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        exe = build(Path(tmp))
        runs = {name: {"int8": [], "bf16": [], "f32": [], "err": 0.0} for name, _, _ in SHAPES}
        for _ in range(args.rounds):
            for name, n, k in SHAPES:
                ms, err = int8_ms(exe, n, k, args.reps)
                r = runs[name]
                r["int8"].append(ms)
                r["err"] = max(r["err"], err)
                r["bf16"].append(torch_ms(torch.bfloat16, n, k, args.reps))
                r["f32"].append(torch_ms(torch.float32, n, k, args.reps))
    for name, n, k in SHAPES:
        r = runs[name]
        gmac = M * n * k / 1e6
        res["shapes"][name] = {
            "n": n,
            "k": k,
            "max_rel_err": r["err"],
            **{f"{s}_gmac_s": [gmac / x for x in r[s]] for s in ("int8", "bf16", "f32")},
            "int8_over_bf16": [b / i for i, b in zip(r["int8"], r["bf16"], strict=True)],
        }
    res["load_after"] = loadavg()
    args.out.with_suffix(".json").write_text(json.dumps(res, indent=1))
    args.out.write_text(markdown(res))
    print(markdown(res))
    return 0


def _cell(xs: list[float], fmt: str = ".1f") -> str:
    return f"{statistics.median(xs):{fmt}} [{min(xs):{fmt}}–{max(xs):{fmt}}]"


def markdown(res: dict) -> str:
    h = res["host"]
    lines = [
        "# int8 GEMM microkernel (VNNI, per-32 scales) against torch's bf16 and f32 GEMMs, one thread",
        "",
        f"CPU: {h.get('cpu', '?')}; M = {res['m']} tokens; {res['rounds']} interleaved rounds, median [min–max]; "
        f"load {res['load_before']} before, {res['load_after']} after.",
        "",
        f"lscpu flags: `{h.get('cpu_flags', '?')}`",
        "",
        "| shape | N | K | int8 GMAC/s | bf16 GMAC/s | f32 GMAC/s | int8 / bf16 | max rel. error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, s in res["shapes"].items():
        lines.append(
            f"| {name} | {s['n']} | {s['k']} | {_cell(s['int8_gmac_s'])} | {_cell(s['bf16_gmac_s'])} | "
            f"{_cell(s['f32_gmac_s'])} | {_cell(s['int8_over_bf16'], '.2f')} | {s['max_rel_err']:.1e} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
