"""attention: naive attention vs scaled_dot_product_attention, and each SDPA backend this device
offers (flash, memory-efficient, cuDNN, math), causal, over sequence lengths; time and peak memory.

"naive" is the engine's own fallback (engine.models.llama.attend with impl="naive"): it materializes
the [B,H,T,T] scores, which is what the fused kernels avoid. A backend is benchmarked only where a
probe call succeeds; the reason for each one left out is saved in the run's settings.
"""

from __future__ import annotations

from dataclasses import dataclass

from opscope.engine.bench.measure.options import (
    DTYPE_BYTES,
    BenchOptions,
    SuitePlan,
    check_torch_device,
    free_memory_bytes,
)
from opscope.engine.bench.measure.params import param
from opscope.engine.bench.measure.runner import Derived, Point, skipped_point

NAME = "attention"
DESCRIPTION = "naive vs SDPA and each SDPA backend, causal, seq 128…4096: time and peak memory"
BACKENDS = {
    "sdpa_math": "MATH",
    "sdpa_flash": "FLASH_ATTENTION",
    "sdpa_efficient": "EFFICIENT_ATTENTION",
    "sdpa_cudnn": "CUDNN_ATTENTION",
}


@dataclass(frozen=True)
class Params:
    seq_lens: tuple[int, ...] = param(
        (128, 256, 512, 1024, 2048, 4096), "Sequence lengths", "tokens", "Sequence lengths measured, one point each."
    )
    batch: int = param(1, "Batch size", "sequences", "Sequences processed together in each call.")
    heads: int = param(8, "Attention heads", "", "Query heads of the attention call.")
    head_dim: int = param(64, "Head size", "elements", "Elements per attention head.")


QUICK = Params(seq_lens=(128, 256), heads=4)


def _inputs(p: Params, T: int, device: str, dtype: str):
    import torch

    g = torch.Generator(device="cpu").manual_seed(T)
    shape = (p.batch, p.heads, T, p.head_dim)  # [B,H,T,D]
    return [torch.randn(shape, generator=g).to(device=device, dtype=getattr(torch, dtype)) for _ in range(3)]


def _call(variant: str):
    """The function under test: (q, k, v) → [B,H,T,D]."""
    import torch.nn.functional as F
    from opscope.engine.models.transformer import attend
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if variant == "naive":
        return lambda q, k, v: attend(q, k, v, None, "naive")
    if variant == "sdpa":  # whatever torch dispatches to by default
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    backend = SDPBackend.__members__[BACKENDS[variant]]

    def call(q, k, v):
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    return call


def available_variants(device: str, dtype: str, head_dim: int = 64) -> dict[str, str]:
    """{variant: "ok" or why it cannot run here}, from a tiny probe call of each."""
    status = {"naive": "ok", "sdpa": "ok"}
    q = _inputs(Params(batch=1, heads=2, head_dim=head_dim), 16, device, dtype)
    for variant in BACKENDS:
        try:
            _call(variant)(*q)
            status[variant] = "ok"
        except RuntimeError as e:
            status[variant] = f"unavailable: {str(e).strip().splitlines()[0][:160]}"
    return status


def causal_flops(p: Params, T: int) -> float:
    # QKᵀ and PV: 2·2·B·H·T·T·D multiply-adds, half of them masked away by causality
    return 2.0 * p.batch * p.heads * T * T * p.head_dim


def make_point(variant: str, T: int, p: Params, device: str, dtype: str) -> Point:
    def prepare():
        q, k, v = _inputs(p, T, device, dtype)
        fn = _call(variant)
        return lambda: fn(q, k, v)

    flop = causal_flops(p, T)
    return Point(
        f"attn_{variant}_{T}",
        "ms",
        prepare,
        value=lambda s: s * 1e3,
        higher_is_better=False,
        params={"variant": variant, "seq": T},
        device=device,
        max_inner=100,
        track_memory=True,
        derived=(Derived(f"attn_{variant}_{T}.gflop_s", "GFLOP/s", lambda ms: flop / (ms / 1e3) / 1e9),),
    )


def _needed_bytes(variant: str, T: int, p: Params, dtype: str) -> int:
    io = 4 * p.batch * p.heads * T * p.head_dim * DTYPE_BYTES[dtype]
    # naive/math hold the scores, the mask and a float32 softmax copy of [B,H,T,T]
    scores = 3 * p.batch * p.heads * T * T * 4 if variant in ("naive", "sdpa_math") else 0
    return io + scores


def _points(variants: list[str], p: Params, device: str, dtype: str):
    for T in p.seq_lens:
        for variant in variants:
            need, free = _needed_bytes(variant, T, p, dtype), free_memory_bytes(device)
            if need > 0.5 * free:
                yield skipped_point(
                    f"attn_{variant}_{T}",
                    "ms",
                    f"needs ~{need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free",
                    {"variant": variant, "seq": T},
                    higher_is_better=False,
                )
            else:
                yield make_point(variant, T, p, device, dtype)


def plan(opts: BenchOptions, params: Params | None = None) -> SuitePlan:
    check_torch_device(opts.device)
    p = params or (QUICK if opts.quick else Params())
    status = available_variants(opts.device, opts.dtype, p.head_dim)
    variants = [v for v, s in status.items() if s == "ok"]
    return SuitePlan(
        points=_points(variants, p, opts.device, opts.dtype),
        n_points=len(variants) * len(p.seq_lens),
        settings={
            "variants": status,
            "seq_lens": list(p.seq_lens),
            "batch": p.batch,
            "heads": p.heads,
            "head_dim": p.head_dim,
            "causal": True,
            "flops": "2·B·H·T²·D (causal half of QKᵀ and PV)",
        },
    )
