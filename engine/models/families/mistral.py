"""Mistral: the Llama core with a sliding window on every layer (config.json ``sliding_window``).
llama.cpp converts Mistral to llama-arch GGUFs (see families.llama); no GGUF architecture of its own."""

from __future__ import annotations

from opscope.engine.models.families import Family, register


def _hf(cfg: dict, base: dict) -> dict:
    return {"sliding_window": int(cfg.get("sliding_window") or 0)}


FAMILY = register(
    Family(
        name="mistral",
        gguf_archs=(),
        hf_model_types=("mistral",),
        hf_architectures=("MistralForCausalLM",),
        hf_fields=_hf,
    )
)
