"""Load a GGUF straight into the fast path: linears from their raw blocks, never dequantized.

engine.api.load dequantizes every tensor to float32 (about 1 s for the default model) and the fast
path then throws the linears' dense copies away. Here only the embedding, the norms and any tensor
without a kernel are dequantized; the linears are packed from the mapped file (0.3 s).
"""
from __future__ import annotations

import logging

import numpy as np
import torch

from engine import markers
from engine.clock import now_ns
from engine.errors import ModelFormatError
from engine.fastpath.apply import LINEAR_PATHS, quantize_linears
from engine.fastpath.options import FastPathOptions
from engine.kernels import KernelBuildError, load_kernels, pack, supported

log = logging.getLogger(__name__)


def dense_tensor(source, name: str) -> torch.Tensor:
    """Float32 tensor ``name`` of a GGUF source (raw blocks dequantized with the fastest decoder)."""
    kind, raw, shape = source.raw_tensor(name)
    if kind in ("F32", "F16"):
        arr = np.array(raw.view(np.float32 if kind == "F32" else np.float16).reshape(shape), dtype=np.float32)
        t = torch.from_numpy(arr)
    elif supported(kind):
        w = pack(kind, raw, shape)
        t = load_kernels().dequantize(w.qs, w.d, w.m, w.qtype, shape[1], torch.float32)
    else:
        import gguf

        t = torch.from_numpy(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[kind]).reshape(shape).copy())
    if name.endswith(("attn.q_proj.bias", "attn.k_proj.bias")) and getattr(source, "arch", "") == "llama":
        from engine.formats.gguf_source import permute_qk_rows  # raw_tensor reorders weights only

        heads = source.config.n_heads if "q_proj" in name else source.config.n_kv_heads
        t = t[torch.from_numpy(permute_qk_rows(shape[0], heads))]
    return t


def _quantizable(source, model) -> set[str]:
    """Linears whose blocks have a kernel (a tied head reads the embedding's blocks)."""
    names = {f"layers.{i}.{p}" for i in range(len(model.layers)) for p in LINEAR_PATHS}
    if not model.config.tie_embeddings:
        names.add("lm_head")
    return {n for n in names if supported(source.raw_tensor(f"{n}.weight")[0])}


def build_quantized(source, options: FastPathOptions, attention: str = "sdpa"):
    """A Transformer on the CPU in float32 whose linears are QuantLinear, built from ``source``."""
    from engine.fastpath import decode
    from engine.models.llama import Transformer, rope_inv_freq

    cfg = source.config
    with torch.device("meta"):
        model = Transformer(cfg, attention)
    skip = {f"{n}.weight" for n in _quantizable(source, model)}
    if cfg.tie_embeddings:
        skip.add("lm_head.weight")
    state = {k: dense_tensor(source, k) for k in model.state_dict() if k not in skip}
    model.load_state_dict(state, strict=False, assign=True)
    freqs = dense_tensor(source, "rope_freqs") if "rope_freqs" in source.tensor_names() else None
    model.inv_freq = rope_inv_freq(cfg, freqs)
    quantize_linears(model, source, options)
    if cfg.tie_embeddings and model.lm_head.weight.is_meta:  # a tied head whose type has no kernel
        model.lm_head.weight = model.embed.weight
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if left:
        raise ModelFormatError(f"{source.path}: tensors left unloaded by the fast-path loader: {left[:4]}")
    if options.fused_decode:
        decode.enable_fused_decode(model, 1 if options.activations == "q8" else 0)
    model.decode_threads = "auto" if options.adapt_threads else None  # engine.generate.decode_threads
    return model.eval().requires_grad_(False)


def _build_pinned(source, options: FastPathOptions, attention: str):
    if options.pin_threads:
        from engine.fastpath.threads import pin_threads

        pin_threads()
    return build_quantized(source, options, attention)


def load(model=None, options: FastPathOptions = FastPathOptions(), *, attention: str = "sdpa",
         threads: int | None = None):
    """engine.api.load for the CPU fast path: a LoadedModel (CPU, float32) with quantized linears.
    Falls back to engine.api.load + apply when the file has no raw blocks, the options ask for
    dense weights, or the kernels cannot be built (``options.on_error="fallback"``)."""
    from engine.api import LoadedModel, LoadOptions
    from engine.api import load as load_dense
    from engine.fastpath.apply import apply
    from engine.formats import open_model

    if threads is not None:
        torch.set_num_threads(threads)
    t0 = now_ns()
    with markers.phase(markers.MODEL_LOAD, model=str(model or "default"), fastpath=True):
        source = open_model(model)
        if options.weights == "q" and hasattr(source, "raw_tensor"):
            try:
                net = _build_pinned(source, options, attention)
                return LoadedModel(source, net, LoadOptions("cpu", "float32", attention, threads),
                                   (now_ns() - t0) / 1e6)
            except KernelBuildError as e:
                if options.on_error == "raise":
                    raise
                log.warning("fast path unavailable, loading dense weights: %s", e)
    lm = load_dense(model, attention=attention, threads=threads, fastpath="off")
    apply(lm.model, lm.source, options)
    return lm
