"""Llama 2/3.x, SmolLM/SmolLM2, TinyLlama: the shared core as it is (RMSNorm, rotate-half RoPE,
SwiGLU). llama.cpp writes Q/K rows permuted for interleaved RoPE in llama-arch files (undone in
engine.formats.gguf_source), and writes Mistral models as llama too: a window in the metadata is
honoured."""

from __future__ import annotations

from opscope.engine.models.families import Family, GGUFMeta, register


def _gguf(m: GGUFMeta, base: dict) -> dict:
    return {"sliding_window": int(m.get("attention.sliding_window", 0) or 0)}


FAMILY = register(
    Family(
        name="llama",
        gguf_archs=("llama",),
        hf_model_types=("llama",),
        hf_architectures=("LlamaForCausalLM",),
        gguf_fields=_gguf,
    )
)
