"""Every tensor a GGUF's architecture needs is in its table, with the shape its config implies.

Run once the config is known and before anything is loaded: a tensor renamed or left out would
otherwise surface as a KeyError in the fast-path loader at generate time, and a shape that disagrees
with the head counts would reach the quantized kernels.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from opscope.engine.core.errors import InvalidHyperparameters, MissingTensor

if TYPE_CHECKING:
    from opscope.engine.models.config import ModelConfig
    from opscope.engine.models.families import Family

_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)$")


def _shapes(cfg: ModelConfig, family: Family | None) -> dict[str, tuple[int, ...]]:
    """GGUF block tensor kind (``attn_q.weight``) → shape in ggml order (ne0 first)."""
    D, F, hd = cfg.dim, cfg.hidden_dim, cfg.head_dim
    q, kv = cfg.n_heads * hd, cfg.n_kv_heads * hd
    shapes = {
        "attn_norm.weight": (D,),
        "ffn_norm.weight": (D,),
        "post_attention_norm.weight": (D,),
        "post_ffw_norm.weight": (D,),
        "attn_q_norm.weight": (hd,),
        "attn_k_norm.weight": (hd,),
        "attn_q.weight": (D, q),
        "attn_k.weight": (D, kv),
        "attn_v.weight": (D, kv),
        "attn_output.weight": (q, D),
        "ffn_gate.weight": (D, F),
        "ffn_up.weight": (D, F),
        "ffn_down.weight": (F, D),
        "attn_q.bias": (q,),
        "attn_k.bias": (kv,),
        "attn_v.bias": (kv,),
    }
    for kind, split in family.gguf_fused.items() if family is not None else ():
        rows = sum(r for _, r in split(cfg))
        shapes[f"{kind}.weight"], shapes[f"{kind}.bias"] = (D, rows), (rows,)
    return shapes


def _required(cfg: ModelConfig, family: Family | None) -> list[str]:
    fused = family.gguf_fused if family is not None else {}
    kinds = ["attn_norm", "attn_output", "ffn_norm", "ffn_up", "ffn_down"]
    kinds += ["attn_qkv"] if "attn_qkv" in fused else ["attn_q", "attn_k", "attn_v"]
    kinds += [] if "ffn_up" in fused else ["ffn_gate"]
    kinds += ["attn_q_norm", "attn_k_norm"] if cfg.qk_norm else []
    kinds += ["post_attention_norm", "post_ffw_norm"] if cfg.post_norms else []
    return [f"{k}.weight" for k in kinds]


def check_tensor_shapes(path: Path, tensors: dict, family: Family | None, cfg: ModelConfig) -> None:
    """``tensors``: GGUF name → TensorEntry. MissingTensor for an absent tensor the architecture
    needs; InvalidHyperparameters for a shape the config contradicts, or blocks beyond block_count."""
    top = {"token_embd.weight": (cfg.dim, cfg.vocab_size), "output_norm.weight": (cfg.dim,)}
    if not cfg.tie_embeddings:
        top["output.weight"] = (cfg.dim, cfg.vocab_size)
    for name in top:
        if name not in tensors:
            raise MissingTensor(path, f"tensor {name} is missing")
    blocks = {int(m.group(1)) for m in map(_BLOCK.match, tensors) if m}
    beyond = max(blocks, default=-1)
    if beyond >= cfg.n_layers:
        raise InvalidHyperparameters(
            path,
            f"tensor blk.{beyond}.* lies beyond the {cfg.n_layers} blocks that the block_count metadata key declares",
        )
    for i in range(cfg.n_layers):
        for kind in _required(cfg, family):
            if f"blk.{i}.{kind}" not in tensors:
                raise MissingTensor(path, f"tensor blk.{i}.{kind} is missing (the model has {cfg.n_layers} blocks)")
    shapes = _shapes(cfg, family)
    for name, entry in tensors.items():
        m = _BLOCK.match(name)
        want = top.get(name) if m is None else shapes.get(f"{m.group(2)}.{m.group(3)}")
        if want is not None and tuple(entry.shape) != want:
            raise InvalidHyperparameters(
                path, f"tensor {name} has shape {tuple(entry.shape)} (ggml order) but the metadata's sizes imply {want}"
            )


def check_vocabulary(path: Path, meta: dict, cfg: ModelConfig) -> None:
    """The tokenizer cannot produce an id the embedding has no row for."""
    tokens = meta.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list) and len(tokens) > cfg.vocab_size:
        raise InvalidHyperparameters(
            path,
            f"tokenizer.ggml.tokens holds {len(tokens)} tokens but the model has "
            f"{cfg.vocab_size} embedding rows (vocab_size)",
        )
