"""Gemma 2: GeGLU (tanh-approximated GELU), Gemma norms (x·(1+w): GGUF stores 1+w, config.json w),
norms after attention and after the MLP, embeddings × √dim, soft-capped attention scores and
logits, local (sliding-window) and global layers alternating (layer 0 local), and the query scale
1/√query_pre_attn_scalar."""

from __future__ import annotations

import math

from opscope.engine.models.families import Family, GGUFMeta, hf_layer_windows, pattern_windows, register

GGUF_POST_NORMS = {"post_attention_norm": "post_attn_norm", "post_ffw_norm": "post_mlp_norm"}
HF_NORMS = {
    "post_attention_layernorm": "post_attn_norm",
    "pre_feedforward_layernorm": "mlp_norm",
    "post_feedforward_layernorm": "post_mlp_norm",
}


def query_pre_attn_scalar(base: dict, big_layers: int) -> int:
    # llama.cpp (and the published configs): dim/heads for the 27B models, the head dim otherwise
    return (
        base["dim"] // base["n_heads"]
        if base["n_layers"] == big_layers
        else (base["head_dim"] or base["dim"] // base["n_heads"])
    )


def gemma_common(base: dict) -> dict:
    return {"mlp_act": "gelu_tanh", "post_norms": True, "embed_scale": math.sqrt(base["dim"])}


def _gguf(m: GGUFMeta, base: dict) -> dict:
    window = int(m.get("attention.sliding_window", 4096))
    return {
        **gemma_common(base),
        "tie_embeddings": True,
        "attn_scale": query_pre_attn_scalar(base, 46) ** -0.5,
        "attn_softcap": float(m.get("attn_logit_softcapping", 50.0)),
        "final_softcap": float(m.get("final_logit_softcapping", 30.0)),
        "layer_windows": pattern_windows(base["n_layers"], window, m.get("attention.sliding_window_pattern", 2)),
    }


def _hf(cfg: dict, base: dict) -> dict:
    return {
        **gemma_common(base),
        "norm_eps": float(cfg.get("rms_norm_eps", 1e-6)),
        "tie_embeddings": bool(cfg.get("tie_word_embeddings", True)),
        "attn_scale": float(cfg.get("query_pre_attn_scalar", 256)) ** -0.5,
        "attn_softcap": float(cfg.get("attn_logit_softcapping") or 0.0),
        "final_softcap": float(cfg.get("final_logit_softcapping") or 0.0),
        "layer_windows": hf_layer_windows(cfg, int(cfg.get("sliding_window") or 4096), 2),
    }


FAMILY = register(
    Family(
        name="gemma2",
        gguf_archs=("gemma2",),
        hf_model_types=("gemma2",),
        hf_architectures=("Gemma2ForCausalLM",),
        gguf_fields=_gguf,
        hf_fields=_hf,
        gguf_tensors=GGUF_POST_NORMS,
        hf_tensors=HF_NORMS,
        hf_norm_offset=1.0,
    )
)
