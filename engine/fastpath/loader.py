"""Load a GGUF straight into the fast path: linears and embedding from their raw blocks, never dequantized.

engine.api.load dequantizes every tensor to float32 (about 1 s for the default model) and the fast
path then throws the dense copies away. Here only the norms (and biases) are dequantized; the
linears and the token embedding are read from the mapped file (Q4_1/Q8_0 repacked, every other
type a view of the file's blocks).
"""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np
import torch
from opscope.engine.core import markers
from opscope.engine.core.clock import now_ns
from opscope.engine.core.errors import ModelFormatError
from opscope.engine.fastpath.apply import prepare_process, quantize_linears, weight_bytes
from opscope.engine.fastpath.kernels import KernelBuildError, load_kernels, pack, supported
from opscope.engine.fastpath.options import FastPathOptions

log = logging.getLogger(__name__)


def dense_tensor(source, name: str) -> torch.Tensor:
    """Float32 tensor ``name`` of a GGUF source (raw blocks dequantized with the fastest decoder)."""
    kind, raw, shape = source.raw_tensor(name)
    if kind in ("F32", "F16"):
        arr = np.array(raw.view(np.float32 if kind == "F32" else np.float16).reshape(shape), dtype=np.float32)
        t = torch.from_numpy(arr)
    elif len(shape) == 2 and supported(kind, shape[1]):
        w = pack(kind, raw, shape, layout="raw")
        t = load_kernels().dequantize(w.qs, w.d, w.m, w.qtype, shape[1], torch.float32)
    else:
        import gguf

        t = torch.from_numpy(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[kind]).reshape(shape).copy())
    if name.endswith(("attn.q_proj.bias", "attn.k_proj.bias")) and getattr(source, "arch", "") == "llama":
        from opscope.engine.formats.gguf_source import permute_qk_rows  # raw_tensor reorders weights only

        heads = source.config.n_heads if "q_proj" in name else source.config.n_kv_heads
        t = t[torch.from_numpy(permute_qk_rows(shape[0], heads))]
    return t


def build_quantized(source, options: FastPathOptions, attention: str = "sdpa"):
    """A Transformer on the CPU in float32 whose linears are QuantLinear and whose embedding is a
    QuantEmbedding, built from ``source``; only the norms (and biases) are dense."""
    from opscope.engine.fastpath import decode
    from opscope.engine.models.transformer import Transformer

    cfg = source.config
    with torch.device("meta"):
        model = Transformer(cfg, attention)
    counts = quantize_linears(model, source, options)  # swaps modules of the empty (meta) model
    skip = {"lm_head.weight"} if cfg.tie_embeddings else set()
    state = {k: dense_tensor(source, k) for k, t in model.state_dict().items() if t.is_meta and k not in skip}
    model.load_state_dict(state, strict=False, assign=True)
    freqs = dense_tensor(source, "rope_freqs") if "rope_freqs" in source.tensor_names() else None
    model.set_rope(freqs, torch.device("cpu"))  # and the local RoPE of windowed layers (Gemma 3)
    if cfg.tie_embeddings and isinstance(model.lm_head, torch.nn.Linear) and model.lm_head.weight.is_meta:
        model.lm_head.weight = model.embed.weight  # a tied head whose type has no kernel
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if left:
        raise ModelFormatError(f"{source.path}: tensors left unloaded by the fast-path loader: {left[:4]}")
    log.info(
        "fast path: %s: weights %s; %.1f MB in memory for a %.1f MB file",
        source.path,
        counts,
        weight_bytes(model) / 1e6,
        getattr(source, "file_size_bytes", 0) / 1e6,
    )
    if options.fused_decode:
        decode.enable_fused_decode(model, 1 if options.activations == "q8" else 0)
    model.decode_threads = "auto" if options.adapt_threads else None  # engine.generate.decode_threads
    if hasattr(source, "release_pages"):
        source.release_pages()  # the packed weights are copies: the file's pages are not needed (-1x file in RSS)
    return model.eval().requires_grad_(False)


def _build_in_prepared_process(source, options: FastPathOptions, attention: str):
    prepare_process(options)
    return build_quantized(source, options, attention)


def load(
    model=None, options: FastPathOptions = FastPathOptions(), *, attention: str = "sdpa", threads: int | None = None
):
    """engine.api.load for the CPU fast path: a LoadedModel (CPU, float32) with quantized linears.
    Falls back to the plain model (engine.loaded.load_plain) + apply when the file has no raw
    blocks, the options ask for dense weights, or the kernels cannot be built
    (``options.on_error="fallback"``)."""
    from opscope.engine.fastpath.apply import apply
    from opscope.engine.formats import open_model
    from opscope.engine.generation.loaded import LoadedModel, LoadOptions, load_plain

    if threads is not None:
        torch.set_num_threads(threads)
    t0 = now_ns()
    with markers.phase(markers.MODEL_LOAD, model=str(model or "default"), fastpath=True):
        source = open_model(model)
        if options.weights == "q" and hasattr(source, "raw_tensor"):
            try:
                net = _build_in_prepared_process(source, options, attention)
                return LoadedModel(
                    source, net, LoadOptions("cpu", "float32", attention, threads), (now_ns() - t0) / 1e6
                )
            except KernelBuildError as e:
                if options.on_error == "raise":
                    raise
                log.warning("fast path unavailable, loading dense weights: %s", e)
                options = replace(options, weights="dense")  # apply must not try (and log) the kernels again
    lm = load_plain(model, attention=attention, threads=threads)
    apply(lm.model, lm.source, options)
    return lm


class _KernelDecoded:
    """A GGUF source whose tensors the kernels decode (``dense_tensor``), for engine.models.build_model."""

    def __init__(self, source):
        self.config, self.path, self._source = source.config, source.path, source

    def iter_tensors(self):
        for name in self._source.tensor_names():
            yield name, dense_tensor(self._source, name)


def plain_twin(lm):
    """The plain torch model of a fast-path ``lm`` (a trace's twin: torch ops a dispatch mode can see),
    built from the same file with its blocks decoded by the kernels: the same float32 weights as
    engine.api.load(fastpath="off"), whose numpy decoders take ~10x as long (a 1.2 B Q4_K_M file: 17 s)."""
    from opscope.engine.core.devices import resolve_dtype
    from opscope.engine.generation.loaded import LoadedModel, LoadOptions
    from opscope.engine.models.loader import build_model

    o = lm.options
    t0 = now_ns()
    with markers.phase(markers.MODEL_LOAD, model=str(lm.source.path), twin=True):
        net = build_model(_KernelDecoded(lm.source), torch.device("cpu"), resolve_dtype(o.dtype), o.attention)
    net.decode_threads = 1  # as load_plain: engine.generate.decode_threads
    return LoadedModel(lm.source, net, LoadOptions("cpu", o.dtype, o.attention, o.threads), (now_ns() - t0) / 1e6)
