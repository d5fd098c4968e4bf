"""Decode-step fast paths: the fused C++ step (one call per token) and torch.compile of the step.

The fused step is swapped in by changing the model's class to a subclass whose forward sends
batch-1 single-token calls with a KV cache to the C++ step and everything else (prefill, batches,
cache-less reference passes) to the model's own forward. It reads the model's KV cache tensors, so
prefill by the torch model and decode by the fused step share one cache.
"""
from __future__ import annotations

import logging

import torch

from engine.fastpath.qlinear import QuantLinear

log = logging.getLogger(__name__)

_LAYER_LINEARS = ("attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj",
                  "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def _spec(lin: QuantLinear) -> tuple:
    return (lin.qtype, lin.qs, lin.d, lin.m, lin.bias)


def fusable(model) -> bool:
    """True when every weight matmul is a QuantLinear and the model is float32 on the CPU."""
    mods = [model.lm_head] + [layer.get_submodule(p) for layer in model.layers for p in _LAYER_LINEARS]
    return (all(isinstance(m, QuantLinear) for m in mods) and model.embed.weight.dtype == torch.float32
            and model.embed.weight.device.type == "cpu")


def build_step(model, act_mode: int):
    """The C++ DecodeModel over ``model``'s packed weights (norms, embedding and rope shared)."""
    from engine.kernels import load_kernels

    cfg = model.config
    step = load_kernels().DecodeModel(cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.hidden_dim,
                                      float(cfg.norm_eps), act_mode, model.embed.weight, model.inv_freq,
                                      model.norm.weight, _spec(model.lm_head))
    for layer in model.layers:
        step.add_layer(layer.attn_norm.weight, layer.mlp_norm.weight,
                       [_spec(layer.get_submodule(p)) for p in _LAYER_LINEARS])
    return step


class FusedDecodeMixin:
    """Mixed into the model's class: batch-1 single-token decode with a cache goes to the C++ step."""

    _fused_step = None
    _fused_cache = ()  # (layer 0's KVCache,) last handed to the step; a tuple, not a submodule

    def forward(self, idx, input_pos=0, *, pad=None, last_only=False):
        if self._fused_step is None or not self.is_decode_step(idx, pad):
            return super().forward(idx, input_pos, pad=pad, last_only=last_only)
        self._sync_cache()
        pos = int(input_pos[0]) if isinstance(input_pos, torch.Tensor) else int(input_pos)
        return self._fused_step.step(int(idx[0, 0]), pos)

    def _sync_cache(self) -> None:
        cache = self.layers[0].attn.cache
        if not self._fused_cache or cache is not self._fused_cache[0]:  # setup_cache() made new buffers
            self._fused_step.set_cache([layer.attn.cache.k for layer in self.layers],
                                       [layer.attn.cache.v for layer in self.layers])
            self._fused_cache = (cache,)


def enable_fused_decode(model, act_mode: int) -> bool:
    """Swap in the fused decode step; False (model unchanged) when the model is not fusable."""
    if not fusable(model):
        log.info("fast path: fused decode needs every linear quantized (Q4_1/Q8_0) and float32; skipped")
        return False
    base = type(model)
    if not issubclass(base, FusedDecodeMixin):
        model.__class__ = type(f"Fused{base.__name__}", (FusedDecodeMixin, base), {})
    model._fused_step = build_step(model, act_mode)
    model._fused_cache = ()
    return True


def compile_decode(model) -> None:
    """torch.compile the single-token decode step (engine.models.compiled) where the fused C++ step
    does not already run it."""
    from engine.models.compiled import enable_compiled_decode

    if getattr(model, "_fused_step", None) is not None:
        log.info("fast path: compile_decode skipped: the fused C++ step runs decode")
        return
    enable_compiled_decode(model)
