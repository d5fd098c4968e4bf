"""engine.fastpath.apply: swap a loaded Transformer's linear layers for quantized-kernel ones."""

from __future__ import annotations

import functools
import logging

import torch.nn as nn
from opscope.engine.core import heap
from opscope.engine.fastpath.kernels import KernelBuildError, pack, supported
from opscope.engine.fastpath.options import FastPathOptions

log = logging.getLogger(__name__)

LINEAR_PATHS = (
    "attn.q_proj",
    "attn.k_proj",
    "attn.v_proj",
    "attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)


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


def _pack(source, name: str, layout: str = "auto"):
    """The PackedWeight of GGUF tensor ``name``, or (None, type) when no kernel reads it."""
    ggml_type, raw, shape = source.raw_tensor(name)
    if not supported(ggml_type, shape[-1]) or len(shape) != 2:
        return None, ggml_type
    return pack(ggml_type, raw, shape, layout=layout), ggml_type


def quantize_linears(model, source, options: FastPathOptions) -> dict[str, int]:
    """Replace every linear, and the token embedding, by a module over its GGUF blocks (each its
    own type); returns {ggml type: count swapped} ("dense:TYPE" for tensors left as they are)."""
    from opscope.engine.fastpath.qlinear import (
        QuantEmbedding,
        QuantLinear,
        QuantMLP,
        ensure_op,
        install_prefill_kernels,
        project_qkv,
        qkv_fusable,
    )

    ensure_op()
    counts: dict[str, int] = {}
    tied = model.config.tie_embeddings
    # A tied head reads the embedding's blocks: Q4_1/Q8_0 repacked for the tuned matvec; an untied
    # embedding stays a view of the file (a lookup reads a few rows).
    embed, embed_type = _pack(source, "embed.weight", "auto" if tied else "raw")
    for name in linear_names(model):
        packed, ggml_type = (embed, embed_type) if name == "lm_head" and tied else _pack(source, _raw_name(model, name))
        if packed is None:
            counts[f"dense:{ggml_type}"] = counts.get(f"dense:{ggml_type}", 0) + 1
            continue
        old = model.get_submodule(name)
        bias = getattr(old, "bias", None)
        new = QuantLinear(
            packed,
            bias,
            act_mode=1 if options.activations == "q8" else 0,
            gemm_min_rows=options.gemm_min_rows,
            gemm_dtype=options.prefill_dtype,
        )
        _swap(model, name, new)
        counts[ggml_type] = counts.get(ggml_type, 0) + 1
        if name.endswith("down_proj") and hasattr(source, "release_pages"):
            source.release_pages()  # a layer packed: its file pages need not stay resident beside the copies
    for layer in model.layers:  # prefill runs gate, up and the activation as one op; q, k, v as one
        if QuantMLP.fusable(layer.mlp):
            layer.mlp = QuantMLP(layer.mlp)
        if qkv_fusable(layer.attn):
            layer.attn.project = functools.partial(project_qkv, layer.attn)
    install_prefill_kernels(model)  # one-pass RMSNorm; RoPE + KV write + attention as one op at prefill
    if embed is not None:
        model.embed = QuantEmbedding(embed)
        counts[f"embed:{embed_type}"] = 1
    else:
        counts[f"dense:{embed_type}"] = counts.get(f"dense:{embed_type}", 0) + 1
    return counts


def weight_bytes(model) -> int:
    """Bytes the model's weights occupy: parameters and buffers, each storage counted once (a tied
    head and the embedding share theirs); the KV cache and RoPE tables excluded."""
    seen, total = set(), 0
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if ".cache." in name or "inv_freq" in name or t.device.type == "meta":
            continue
        key = (t.untyped_storage().data_ptr(), t.data_ptr())
        if key not in seen:
            seen.add(key)
            total += t.numel() * t.element_size()
    return total


def prepare_process(options: FastPathOptions) -> None:
    """The fast path's process-wide settings, once before its kernels load: threads pinned to
    cores, and freed memory kept in the heap so a prefill's temporaries are reused (engine.core.heap)."""
    if options.pin_threads:
        from opscope.engine.fastpath.threads import pin_threads

        pin_threads()
    if options.keep_heap:
        heap.keep_freed_memory()


def apply(model, source, options: FastPathOptions = FastPathOptions()):
    """Apply the CPU fast path to ``model`` (an engine.models.llama.Transformer on the CPU, loaded
    from ``source``) in place, and return it. Sources without raw quantized blocks (safetensors),
    non-CPU models and ``weights="dense"`` leave the weights as they are."""
    from opscope.engine.fastpath import decode

    if options.weights == "q" and _can_quantize(model, source):
        try:
            prepare_process(options)
            counts = quantize_linears(model, source, options)
            log.info(
                "fast path: quantized weights %s (activations %s, prefill %s); weights %.1f MB",
                counts,
                options.activations,
                options.prefill_dtype,
                weight_bytes(model) / 1e6,
            )
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
