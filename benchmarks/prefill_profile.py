"""Where prefill time goes: pp (default 512) of a GGUF on the CPU fast path, by operator.

    .venv/bin/python benchmarks/prefill_profile.py FILE.gguf [--pp 512] [--threads 2] [--fastpath SPEC]

Prints torch.profiler's table grouped by operator (self CPU time: opscope::qlinear's own time is its
dequantization; the GEMM shows as aten::mm/addmm beneath it, or inside it for the fused kernel), then
the time per module kind (q/k/v/o, gate/up/down, lm_head, attention, norms) from forward hooks.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict


def module_times(model, toks, reps: int) -> dict[str, float]:
    """Seconds per pass spent in each kind of module (wall time around the module's forward)."""
    import torch

    totals: dict[str, float] = defaultdict(float)
    starts: dict[int, float] = {}

    def kind(name: str) -> str | None:
        last = name.rsplit(".", 1)[-1]
        if last.endswith("_proj") or last == "lm_head":
            return last
        if last in ("attn_norm", "mlp_norm", "norm"):
            return "norm"
        return None

    handles = []
    for name, mod in model.named_modules():
        k = kind(name)
        if k is None:
            continue

        def pre(m, args, key=id(mod)):
            starts[key] = time.perf_counter()

        def post(m, args, out, key=id(mod), k=k):
            totals[k] += time.perf_counter() - starts[key]

        handles += [mod.register_forward_pre_hook(pre), mod.register_forward_hook(post)]
    try:
        t0 = time.perf_counter()
        for _ in range(reps):
            with torch.inference_mode():
                model(toks, 0, last_only=True)
        totals["total"] = time.perf_counter() - t0
    finally:
        for h in handles:
            h.remove()
    return {k: v / reps for k, v in totals.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--fastpath", default="auto")
    ap.add_argument("--no-profiler", action="store_true")
    args = ap.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    from opscope.engine.api import load

    lm = load(args.model, threads=args.threads, fastpath=args.fastpath)
    model = lm.model
    model.setup_cache(1, args.pp)
    toks = torch.randint(0, lm.config.vocab_size, (1, args.pp))
    with torch.inference_mode():
        model(toks, 0, last_only=True)  # warm-up
    t0 = time.perf_counter()
    for _ in range(args.reps):
        with torch.inference_mode():
            model(toks, 0, last_only=True)
    dt = (time.perf_counter() - t0) / args.reps
    print(f"pp{args.pp}: {dt * 1e3:.1f} ms, {args.pp / dt:.1f} tok/s")
    per = module_times(model, toks, args.reps)
    total = per.pop("total")
    print(f"by module (hooks, {total * 1e3:.1f} ms per pass):")
    for k, v in sorted(per.items(), key=lambda kv: -kv[1]):
        print(f"  {k:10s} {v * 1e3:8.1f} ms  {100 * v / total:5.1f} %")
    fused = any(getattr(layer.attn, "project", None) is not None for layer in model.layers)
    note = "; q/k/v as one int8 op (Attention.project)" if fused else ""
    print(f"  {'other':10s} {(total - sum(per.values())) * 1e3:8.1f} ms  (attention core, RoPE, residual, embed{note})")
    if not args.no_profiler:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof, torch.inference_mode():
            model(toks, 0, last_only=True)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
