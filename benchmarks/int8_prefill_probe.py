"""Would an int8 prefill GEMM carry pp512 ≥ 1.5× llama.cpp? Its accuracy and speed, per activation group.

    .venv/bin/python benchmarks/int8_prefill_probe.py [--model FILE.gguf] [--pp 512] [--threads 2]
        [--groups 32,64,192,0] [--out benchmarks/results/int8_prefill_probe.md]

An int8 GEMM needs one scale per (token, group of K) for the activations and per (row, group) for
the weights; a library GEMM (oneDNN's, through ``torch._int_mm``) has none inside K, so K is cut
into groups of G and each group's int32 product is scaled and summed in float32. Small groups keep
the activations' outliers local (accuracy), large ones keep the GEMM long (speed). This measures
both ends on one model:

- accuracy: teacher-forced logits of the first ``--pp`` tokens of a stable English text, every
  linear of the model simulated in float64-exact arithmetic at each quantization, against the
  engine's exact float32 prefill: KL(exact ‖ int8) per position (mean, max) and top-1 agreement.
  Weights per row (G = K) or per group, activations per group; G = 0 stands for the whole row.
- speed: for each weight shape of the model at M = ``--pp`` rows, float32 ``a @ b.T`` (MKL)
  against the grouped ``torch._int_mm`` (oneDNN), interleaved, medians of wall time; the sum over
  a layer's shapes gives the linears' speed-up.

The host (lscpu flags, load) and any ISA cap (ATEN_CPU_CAPABILITY, MKL_ENABLE_INSTRUCTIONS,
ONEDNN_MAX_CPU_ISA: an AVX2 stand-in) go into the result file.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

TEXT = Path("/usr/share/common-licenses/GPL-3")
CAPS = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "OPSCOPE_CPU_VARIANT")


def fake_quant(t, group: int):
    """Symmetric int8 round trip of t [R, K] with one scale per (row, group of K); group 0: per row."""
    import torch

    R, K = t.shape
    g = K if group in (0, K) or K % group else group
    v = t.reshape(R, K // g, g)
    s = v.abs().amax(-1, keepdim=True).clamp_min(1e-30) / 127
    return (torch.round(v / s) * s).reshape(R, K)


def accuracy(model_path: str, pp: int, threads: int, schemes: list[tuple[str, int | None, int | None]]) -> list[dict]:
    """[(name, weight group or None for exact, activation group or None)] → KL/top-1 rows."""
    import torch
    import torch.nn.functional as F
    from opscope.engine.api import load
    from opscope.engine.fastpath import qlinear as QL

    torch.set_num_threads(threads)
    lm = load(model_path, threads=threads)
    ids = lm.tokenizer.encode(TEXT.read_text())[:pp]

    def logits():
        lm.model.setup_cache(1, len(ids) + 1)
        with torch.inference_mode():
            return torch.log_softmax(lm.model(torch.tensor([ids]), 0)[0].double(), -1)

    ref = logits()
    lin, mlp = QL.QuantLinear.forward, QL.QuantMLP.forward
    dense: dict[int, torch.Tensor] = {}
    rows = []
    for name, wg, xg in schemes:

        def linear(self, x, wg=wg, xg=xg):
            x2 = x.reshape(-1, x.shape[-1]).double()
            w = dense.setdefault(id(self), QL.dequantize(self.packed).double())
            w = w if wg is None else fake_quant(w, wg)
            x2 = x2 if xg is None else fake_quant(x2, xg)
            y = (x2 @ w.t()).float()
            y = y if self.bias is None else y + self.bias
            return y.reshape(*x.shape[:-1], -1)

        def glu(self, x):
            act = (lambda t: F.gelu(t, approximate="tanh")) if self.gelu else F.silu
            return self.down_proj(act(self.gate_proj(x)) * self.up_proj(x))

        QL.QuantLinear.forward, QL.QuantMLP.forward = linear, glu
        try:
            got = logits()
        finally:
            QL.QuantLinear.forward, QL.QuantMLP.forward = lin, mlp
        kl = (ref.exp() * (ref - got)).sum(-1)
        top1 = (ref.argmax(-1) == got.argmax(-1)).double().mean().item()
        rows.append({"scheme": name, "kl_mean": kl.mean().item(), "kl_max": kl.max().item(), "top1": top1})
    return rows


def shapes_of(model_path: str) -> dict[str, tuple[int, int]]:
    from opscope.engine.formats.gguf_source import GGUFSource

    cfg = GGUFSource(Path(model_path)).config
    C, Hd, kv = cfg.dim, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    return {"q": (Hd, C), "k": (kv, C), "v": (kv, C), "o": (C, Hd), "gate": (cfg.hidden_dim, C),
            "up": (cfg.hidden_dim, C), "down": (C, cfg.hidden_dim)}  # fmt: skip


def speed(shapes: dict, pp: int, threads: int, groups: list[int], rounds: int) -> dict:
    """Per group size: the summed wall time of one layer's linears, f32 and grouped int8, per round."""
    import torch

    torch.set_num_threads(threads)

    def grouped(N, K, G):
        g = K if G in (0, K) or K % G else G
        n = K // g
        xq = torch.randint(-127, 128, (n, pp, g), dtype=torch.int8)
        wq = torch.randint(-127, 128, (n, N, g), dtype=torch.int8)
        sx, sw = torch.rand(n, pp, 1), torch.rand(n, 1, N)

        def run():
            y = torch.zeros(pp, N)
            for i in range(n):
                y.addcmul_(torch._int_mm(xq[i], wq[i].t()).float(), sx[i] * sw[i])
            return y

        return run

    def f32(N, K):
        a, b = torch.randn(pp, K), torch.randn(N, K)
        return lambda: a @ b.t()

    cases = {"f32": [f32(N, K) for N, K in shapes.values()]}
    for G in groups:
        cases[f"int8 G={G or 'K'}"] = [grouped(N, K, G) for N, K in shapes.values()]
    for fs in cases.values():  # warm-up: oneDNN's primitives, MKL's buffers
        for f in fs:
            f()
    times: dict[str, list[float]] = {k: [] for k in cases}
    for _ in range(rounds):
        for k, fs in cases.items():  # interleaved: each round runs every case once
            t0 = time.perf_counter()
            for f in fs:
                f()
            times[k].append(time.perf_counter() - t0)
    return times


def host() -> dict:
    import subprocess

    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=30).stdout
    fields = dict(line.split(":", 1) for line in lscpu.splitlines() if ":" in line)
    return {
        "cpu": fields.get("Model name", "?").strip(),
        "flags": fields.get("Flags", "").strip(),
        "caps": " ".join(f"{k}={os.environ[k]}" for k in CAPS if k in os.environ) or "none (native)",
    }


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def markdown(res: dict) -> str:
    h = res["host"]
    out = [
        f"# int8 prefill probe: {Path(res['model']).name}, M = {res['pp']}, {res['threads']} threads",
        "",
        f"Started {res['started']}; load average before {res['load_before']}, after {res['load_after']}.",
        f"CPU: {h['cpu']}; ISA caps: {h['caps']}.",
        "",
        f"lscpu flags: `{h['flags']}`",
        "",
        "## Accuracy: KL(exact float32 ‖ scheme) over the text's positions",
        "",
        "| weights | activations | top-1 agree | KL mean | KL max |",
        "|---|---|---|---|---|",
    ]
    for r in res["accuracy"]:
        w, x = r["scheme"].split(" / ")
        out.append(f"| {w} | {x} | {r['top1']:.3f} | {r['kl_mean']:.2e} | {r['kl_max']:.2e} |")
    base = res["speed"]["f32"]
    out += [
        "",
        f"## Speed: one layer's linears at M = {res['pp']} (ms, median [min–max] over rounds; f32/int8 per round)",
        "",
        "| GEMM | ms | speed-up over f32 |",
        "|---|---|---|",
    ]
    for k, ts in res["speed"].items():
        ratios = [b / t for b, t in zip(base, ts)]
        out.append(
            f"| {k} | {statistics.median(ts) * 1e3:.2f} [{min(ts) * 1e3:.2f}–{max(ts) * 1e3:.2f}] | "
            f"{statistics.median(ratios):.2f} [{min(ratios):.2f}–{max(ratios):.2f}] |"
        )
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(Path.home() / ".cache/opscope/gguf_types/SmolLM2-135M-Instruct.Q4_0.gguf"))
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--groups", default="32,64,192,0", help="activation groups to time and check (0: the whole row)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/int8_prefill_probe.md"))
    args = ap.parse_args(argv)
    groups = [int(g) for g in args.groups.split(",")]
    res = {"model": args.model, "pp": args.pp, "threads": args.threads, "host": host(), "load_before": loadavg(),
           "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}  # fmt: skip
    schemes = [("exact / per 32 (the int8 decode mode)", None, 32), ("per row / exact", 0, None)]
    schemes += [(f"per row / per {g or 'row'}", 0, g) for g in groups]
    schemes += [(f"per {g} / per {g}", g, g) for g in groups if g]
    res["accuracy"] = accuracy(args.model, args.pp, args.threads, schemes)
    res["speed"] = speed(shapes_of(args.model), args.pp, args.threads, groups, args.rounds)
    res["load_after"] = loadavg()
    out = Path(args.out)
    out.write_text(markdown(res))
    out.with_suffix(".json").write_text(json.dumps(res, indent=1))
    print(markdown(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
