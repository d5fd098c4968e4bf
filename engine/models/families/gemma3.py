"""Gemma 3 (text): Gemma 2's block without soft-capping, plus QK-norm; five local
(sliding-window) layers to one global, the local ones with their own unscaled RoPE base (10 000)
and the global ones with rope.freq_base (and its linear scaling on the 4B+ models)."""

from __future__ import annotations

from opscope.engine.models.families import Family, GGUFMeta, hf_layer_windows, hf_rope_theta, pattern_windows, register
from opscope.engine.models.families.gemma2 import GGUF_POST_NORMS, HF_NORMS, gemma_common, query_pre_attn_scalar


def _gguf(m: GGUFMeta, base: dict) -> dict:
    window = int(m.get("attention.sliding_window", 512))
    return {
        **gemma_common(base),
        "qk_norm": True,
        "attn_scale": query_pre_attn_scalar(base, 62) ** -0.5,
        "rope_theta": float(m.get("rope.freq_base", 1_000_000.0)),
        "rope_local_theta": float(m.get("rope.freq_base_swa", 10_000.0)),
        "layer_windows": pattern_windows(base["n_layers"], window, m.get("attention.sliding_window_pattern", 6)),
    }


def _hf(cfg: dict, base: dict) -> dict:
    return {
        **gemma_common(base),
        "qk_norm": True,
        "norm_eps": float(cfg.get("rms_norm_eps", 1e-6)),
        "tie_embeddings": bool(cfg.get("tie_word_embeddings", True)),
        "attn_scale": float(cfg.get("query_pre_attn_scalar", 256)) ** -0.5,
        "attn_softcap": float(cfg.get("attn_logit_softcapping") or 0.0),
        "final_softcap": float(cfg.get("final_logit_softcapping") or 0.0),
        "rope_theta": hf_rope_theta(cfg, "full_attention", 1_000_000.0),
        "rope_local_theta": float(
            cfg.get("rope_local_base_freq")
            or hf_rope_theta({"rope_parameters": cfg.get("rope_parameters")}, "sliding_attention", 10_000.0)
        ),
        "layer_windows": hf_layer_windows(
            cfg, int(cfg.get("sliding_window") or 4096), int(cfg.get("sliding_window_pattern") or 6)
        ),
    }


FAMILY = register(
    Family(
        name="gemma3",
        gguf_archs=("gemma3",),
        hf_model_types=("gemma3_text",),
        hf_architectures=("Gemma3ForCausalLM",),
        gguf_fields=_gguf,
        hf_fields=_hf,
        gguf_tensors={**GGUF_POST_NORMS, "attn_q_norm": "attn.q_norm", "attn_k_norm": "attn.k_norm"},
        hf_tensors={**HF_NORMS, "self_attn.q_norm": "attn.q_norm", "self_attn.k_norm": "attn.k_norm"},
        hf_norm_offset=1.0,
    )
)
