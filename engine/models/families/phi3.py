"""Phi-3 / Phi-3.5 mini: the Llama core with fused q|k|v and gate|up projections, split at load into
the core's q/k/v and gate/up (a row split, so quantized blocks stay quantized). LongRoPE variants
(rope_factors_* tensors, "longrope" scaling) and partial rotary dims are refused."""

from __future__ import annotations

from opscope.engine.core.errors import UnsupportedModelError
from opscope.engine.models.config import ModelConfig
from opscope.engine.models.families import Family, GGUFMeta, register


def split_qkv(cfg: ModelConfig) -> list[tuple[str, int]]:
    q, kv = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    return [("attn.q_proj", q), ("attn.k_proj", kv), ("attn.v_proj", kv)]


def split_gate_up(cfg: ModelConfig) -> list[tuple[str, int]]:
    return [("mlp.gate_proj", cfg.hidden_dim), ("mlp.up_proj", cfg.hidden_dim)]  # gate first (HF chunk(2))


def _gguf(m: GGUFMeta, base: dict) -> dict:
    if any(n.startswith("rope_factors") for n in m.tensor_names):
        raise UnsupportedModelError(
            f"{m.path}: Phi-3 LongRoPE (rope_factors_long/short) is not supported; use a 4k-context Phi-3 model"
        )
    head_dim = base["head_dim"] or base["dim"] // base["n_heads"]
    if int(m.get("rope.dimension_count", head_dim)) != head_dim:
        raise UnsupportedModelError(f"{m.path}: partial rotary embeddings are not supported")
    # llama.cpp disables Phi-3's sliding window (and transformers' GGUF loader leaves it unset)
    return {}


def _hf(cfg: dict, base: dict) -> dict:
    rs = cfg.get("rope_scaling") or {}
    if (rs.get("rope_type") or rs.get("type")) in ("longrope", "su", "yarn"):
        raise UnsupportedModelError(f"Phi-3 rope scaling {rs.get('rope_type') or rs.get('type')!r} is not supported")
    if float(cfg.get("partial_rotary_factor", 1.0)) != 1.0:
        raise UnsupportedModelError("partial rotary embeddings (partial_rotary_factor < 1) are not supported")
    return {"sliding_window": int(cfg.get("sliding_window") or 0)}


FAMILY = register(
    Family(
        name="phi3",
        gguf_archs=("phi3",),
        hf_model_types=("phi3",),
        hf_architectures=("Phi3ForCausalLM",),
        gguf_fields=_gguf,
        hf_fields=_hf,
        gguf_fused={"attn_qkv": split_qkv, "ffn_up": split_gate_up},
        hf_fused={"self_attn.qkv_proj": split_qkv, "mlp.gate_up_proj": split_gate_up},
    )
)
