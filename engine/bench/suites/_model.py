"""Shared by the suites that run a Transformer: loading, synthetic tokens, FLOPs and bytes.

FLOPs count 2 per multiply-add of every weight matmul (the embedding lookup is not a matmul) plus
causal attention over the keys each query sees (nanoGPT's estimate_mfu, made exact for a cache
offset). Bytes per decode step are what a batch-1 step must read: every weight once (the embedding
table only for the one row it looks up, unless tied to the output head) plus the KV cache so far.
"""

from __future__ import annotations

from typing import Any

from opscope.engine.bench.ceilings import peaks
from opscope.engine.bench.measure.options import BenchOptions


def load_model(opts: BenchOptions):
    """The model the options name, on their device and dtype (engine.api.load)."""
    if opts.backend != "torch":
        from opscope.engine.core.errors import ConfigError

        raise ConfigError(
            f"this suite drives the model's forward pass directly and needs --backend torch "
            f"(got {opts.backend!r}); `opscope bench llm` is the suite for other backends"
        )
    from opscope.engine.api import load

    return load(
        opts.model,
        device=opts.device,
        dtype=opts.dtype,
        attention=opts.attention,
        threads=opts.threads,
        fastpath=opts.fastpath,
        compile=opts.compile,
        quantize=opts.quantize,
    )


def random_tokens(n: int, vocab_size: int, seed: int, device, batch: int = 1):
    """Synthetic token ids, llama-bench style: the content does not change the work done."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randint(0, vocab_size, (batch, n), generator=g).to(device)  # [B,T]


def fill_cache(model, tokens, chunk: int = 512) -> None:
    """Prefill positions 0..T-1 of the model's cache with ``tokens`` [B,T] (outside any timing)."""
    import torch

    with torch.inference_mode():
        for start in range(0, tokens.shape[1], chunk):
            model(tokens[:, start : start + chunk], start, last_only=True)


def body_matmul_params(cfg) -> int:
    """Weights multiplied per token in the blocks (attention projections and MLP)."""
    attn = cfg.dim * cfg.head_dim * (2 * cfg.n_heads + 2 * cfg.n_kv_heads)
    return cfg.n_layers * (attn + 3 * cfg.dim * cfg.hidden_dim)


def forward_flops(cfg, n_tokens: int, start: int = 0, logits_tokens: int | None = None, batch: int = 1) -> float:
    """FLOPs of one forward pass of ``n_tokens`` new tokens after ``start`` cached ones, computing
    the output head for ``logits_tokens`` of them (all when None)."""
    logits_tokens = n_tokens if logits_tokens is None else logits_tokens
    dense = 2.0 * body_matmul_params(cfg) * n_tokens + 2.0 * cfg.dim * cfg.vocab_size * logits_tokens
    # query i (0-based) attends to start+i+1 keys: Σ = n·start + n(n+1)/2
    keys = n_tokens * start + n_tokens * (n_tokens + 1) / 2
    attn = 2.0 * 2.0 * cfg.n_layers * cfg.n_heads * cfg.head_dim * keys
    return batch * (dense + attn)


def weight_bytes_per_step(model) -> int:
    """Bytes of weights a decode step reads: parameters and weight buffers (quantized blocks),
    without the KV cache, RoPE tables, and the embedding table beyond its one row (unless the output
    head reads the same tensors). Reads only tensor metadata: ``lm_head.weight`` of a quantized head
    would dequantize the whole table (+200 MB peak RSS on the default model)."""
    head = {t.data_ptr() for t in list(model.lm_head.parameters()) + list(model.lm_head.buffers()) if t.numel()}
    vocab = model.config.vocab_size
    seen, total = set(), 0
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if ".cache." in name or "inv_freq" in name or not t.numel() or t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        nbytes = t.numel() * t.element_size()
        if name.startswith("embed.") and t.data_ptr() not in head:
            nbytes //= vocab  # the lookup reads one row of the table (or of its blocks)
        total += nbytes
    return total


def kv_bytes_per_position(cfg, dtype_bytes: int) -> int:
    return 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * dtype_bytes


def model_peaks(opts: BenchOptions, dtype: str | None = None) -> dict[str, Any]:
    """The FLOP/s and bytes/s peaks MFU and MBU divide by, theoretical and measured (run settings)."""
    return peaks.model_peaks(opts.device, dtype or opts.dtype)


def pct(achieved: float, peak: float | None) -> float:
    return achieved / peak * 100.0 if peak else float("nan")
