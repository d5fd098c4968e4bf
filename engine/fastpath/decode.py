"""Decode-step fast paths: the fused C++ step (one call per token) and torch.compile of the step.

The fused step is the model's decode step (``Transformer.set_decode_step``): the model's forward
sends batch-1 single-token calls with a KV cache to the C++ step and everything else (prefill,
batches, cache-less reference passes) to its own layers. It reads the model's KV cache tensors, so
prefill by the torch model and decode by the fused step share one cache.
"""

from __future__ import annotations

import logging

import torch
from opscope.engine.fastpath.qlinear import QuantEmbedding, QuantLinear

log = logging.getLogger(__name__)

_LAYER_LINEARS = (
    "attn.q_proj",
    "attn.k_proj",
    "attn.v_proj",
    "attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)


def _spec(mod) -> tuple:
    """(qtype, qs, d, m, bias) of a QuantLinear/QuantEmbedding; a dense float32 embedding as raw F32 rows."""
    if isinstance(mod, (QuantLinear, QuantEmbedding)):
        return mod.spec()
    from opscope.engine.fastpath.kernels.packing import QTYPE_RAW, RAW_TYPES

    w = mod.weight.detach().contiguous()
    return (QTYPE_RAW + RAW_TYPES["F32"][0], w.view(torch.uint8), None, None, None)


def fusable(model) -> bool:
    """True when every weight matmul is a QuantLinear (any mix of types) and the model is float32
    on the CPU (the embedding quantized, or dense float32), and the config is the plain Llama block
    (the C++ step knows no QK-norm, post norms, GeGLU, scales, soft-caps or sliding windows)."""
    if not model.config.is_llama_core:
        return False
    mods = [model.lm_head] + [layer.get_submodule(p) for layer in model.layers for p in _LAYER_LINEARS]
    embed = model.embed
    return (
        all(isinstance(m, QuantLinear) for m in mods)
        and embed.weight.device.type == "cpu"
        and (isinstance(embed, QuantEmbedding) or embed.weight.dtype == torch.float32)
    )


def build_step(model, act_mode: int):
    """The C++ DecodeModel over ``model``'s packed weights (norms, embedding and rope shared)."""
    from opscope.engine.fastpath.kernels import load_kernels

    cfg = model.config
    step = load_kernels().DecodeModel(
        cfg.dim,
        cfg.n_heads,
        cfg.n_kv_heads,
        cfg.head_dim,
        cfg.hidden_dim,
        float(cfg.norm_eps),
        act_mode,
        _spec(model.embed),
        model.inv_freq,
        model.norm.weight,
        _spec(model.lm_head),
    )
    for layer in model.layers:
        step.add_layer(
            layer.attn_norm.weight, layer.mlp_norm.weight, [_spec(layer.get_submodule(p)) for p in _LAYER_LINEARS]
        )
    return step


class FusedStep:
    """The model's decode step (``Transformer.set_decode_step``) run by the C++ DecodeModel
    ``kernel``, over the KV cache buffers the model holds now."""

    def __init__(self, layers, kernel):
        self.layers, self.kernel = layers, kernel  # the model's ModuleList: no reference cycle
        self.cache = None  # layer 0's KVCache last handed to the kernel

    def __call__(self, idx: torch.Tensor, pos: int) -> torch.Tensor:
        self._sync_cache()
        return self.kernel.step(int(idx[0, 0]), pos)

    def _sync_cache(self) -> None:
        cache = self.layers[0].attn.cache
        if cache is not self.cache:  # setup_cache() made new buffers
            self.kernel.set_cache(
                [layer.attn.cache.k for layer in self.layers], [layer.attn.cache.v for layer in self.layers]
            )
            self.cache = cache


def enable_fused_decode(model, act_mode: int) -> bool:
    """Set the fused C++ decode step (``model.set_decode_step``); False (model unchanged) when the
    model is not fusable."""
    if not fusable(model):
        log.info("fast path: fused decode needs every linear quantized (Q4_1/Q8_0) and float32; skipped")
        return False
    model.set_decode_step(FusedStep(model.layers, build_step(model, act_mode)))
    return True


def compile_decode(model) -> None:
    """torch.compile the single-token decode step (engine.models.compiled) where the fused C++ step
    does not already run it."""
    from opscope.engine.models.compiled import enable_compiled_decode

    if isinstance(model.decode_step, FusedStep):
        log.info("fast path: compile_decode skipped: the fused C++ step runs decode")
        return
    enable_compiled_decode(model)
