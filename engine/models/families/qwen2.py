"""Qwen2 / Qwen2.5: the Llama core with biases on the q, k and v projections."""

from __future__ import annotations

from opscope.engine.models.families import Family, register


def _hf(cfg: dict, base: dict) -> dict:
    windows: tuple[int, ...] = ()
    if cfg.get("use_sliding_window") and cfg.get("sliding_window"):
        # transformers' Qwen2: layers from max_window_layers on attend within the window
        first = int(cfg.get("max_window_layers", 0))
        windows = tuple(int(cfg["sliding_window"]) if i >= first else 0 for i in range(base["n_layers"]))
    return {"qkv_bias": True, "layer_windows": windows}


FAMILY = register(
    Family(
        name="qwen2",
        gguf_archs=("qwen2",),
        hf_model_types=("qwen2",),
        hf_architectures=("Qwen2ForCausalLM",),
        gguf_fields=lambda m, base: {"qkv_bias": True},
        hf_fields=_hf,
    )
)
