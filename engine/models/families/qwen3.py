"""Qwen3: the Llama core with an RMSNorm over each head's q and k before RoPE (QK-norm), no q/k/v
bias, and a head dim of its own (GGUF ``attention.key_length``, config.json ``head_dim``)."""

from __future__ import annotations

from opscope.engine.models.families import Family, register

_QK_NORM = {"attn_q_norm": "attn.q_norm", "attn_k_norm": "attn.k_norm"}

FAMILY = register(
    Family(
        name="qwen3",
        gguf_archs=("qwen3",),
        hf_model_types=("qwen3",),
        hf_architectures=("Qwen3ForCausalLM",),
        gguf_fields=lambda m, base: {"qk_norm": True},
        hf_fields=lambda c, base: {"qk_norm": True},
        gguf_tensors=_QK_NORM,
        hf_tensors={"self_attn.q_norm": "attn.q_norm", "self_attn.k_norm": "attn.k_norm"},
    )
)
