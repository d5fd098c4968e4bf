"""engine.fastpath.apply: swap a loaded Transformer's linear layers for quantized-kernel ones."""
from __future__ import annotations

import logging

import torch.nn as nn

from engine.fastpath.options import FastPathOptions
from engine.kernels import KernelBuildError, pack, supported

log = logging.getLogger(__name__)

LINEAR_PATHS = ("attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj",
                "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def linear_names(model) -> list[str]:
    """Module paths of every weight matmul: layers.N.attn.{q,k,v,o}_proj, layers.N.mlp.*, lm_head."""
    return [f"layers.{i}.{p}" for i in range(len(model.layers)) for p in LINEAR_PATHS] + ["lm_head"]


def _raw_name(model, name: str) -> str:
    # A tied output head has no tensor of its own: it reads the embedding's blocks.
    if name == "lm_head" and model.config.tie_embeddings:
        return "embed.weight"
    return f"{name}.weight"


def _swap(model, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, new)


def quantize_linears(model, source, options: FastPathOptions) -> dict[str, int]:
    """Replace every linear whose GGUF tensor has a kernel; returns {ggml type: count swapped}."""
    from engine.fastpath.qlinear import QuantLinear, ensure_op

    ensure_op()
    counts: dict[str, int] = {}
    for name in linear_names(model):
        ggml_type, raw, shape = source.raw_tensor(_raw_name(model, name))
        if not supported(ggml_type):
            counts[f"dense:{ggml_type}"] = counts.get(f"dense:{ggml_type}", 0) + 1
            continue
        old = model.get_submodule(name)
        bias = getattr(old, "bias", None)
        new = QuantLinear(pack(ggml_type, raw, shape), bias, act_mode=1 if options.activations == "q8" else 0,
                          gemm_min_rows=options.gemm_min_rows, gemm_dtype=options.prefill_dtype)
        _swap(model, name, new)
        counts[ggml_type] = counts.get(ggml_type, 0) + 1
    return counts


def apply(model, source, options: FastPathOptions = FastPathOptions()):
    """Apply the CPU fast path to ``model`` (an engine.models.llama.Transformer on the CPU, loaded
    from ``source``) in place, and return it. Sources without raw quantized blocks (safetensors),
    non-CPU models and ``weights="dense"`` leave the weights as they are."""
    from engine.fastpath import decode, threads

    if options.weights == "q" and _can_quantize(model, source):
        try:
            if options.pin_threads:
                threads.pin_threads()
            counts = quantize_linears(model, source, options)
            log.info("fast path: quantized linears %s (activations %s, prefill %s)", counts,
                     options.activations, options.prefill_dtype)
        except KernelBuildError as e:
            if options.on_error == "raise":
                raise
            log.warning("fast path unavailable, using plain torch: %s", e)
        else:
            if options.fused_decode:
                decode.enable_fused_decode(model, 1 if options.activations == "q8" else 0)
            model.decode_threads = "auto" if options.adapt_threads else None  # engine.generate.decode_threads
    if options.compile_decode:
        decode.compile_decode(model)
    return model


def _can_quantize(model, source) -> bool:
    if model.embed.weight.device.type not in ("cpu", "meta"):
        log.info("fast path: quantized kernels are CPU-only; %s keeps its weights", model.embed.weight.device)
        return False
    if not hasattr(source, "raw_tensor"):
        log.info("fast path: %s has no quantized blocks; weights stay dense", getattr(source, "path", source))
        return False
    return True

