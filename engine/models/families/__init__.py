"""Architectures as a registry: the shared Llama core (engine.models.llama) plus one small module per
family stating only its differences (mlx-lm's layout).

Each family module builds a ``Family`` and registers it by its GGUF ``general.architecture`` and
its Hugging Face ``model_type``. A family states: the config fields it reads from GGUF metadata
and from config.json (on top of the common ones read here), its extra tensor names in both
formats, fused tensors to split at load, and the switches it sets on ModelConfig.

    family_for_gguf("gemma2", path).config_from_gguf(meta)   # → ModelConfig
    family_for_hf(config_json, path).config_from_hf(config_json, path)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from opscope.engine.core.errors import MissingMetadata, ModelFormatError, ModelLoadError, UnsupportedModelError
from opscope.engine.models.config import ModelConfig, RopeScaling

FAMILY_MODULES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3")

# A fused tensor's split: (engine sub-name, rows) in row order, from the model's config.
Split = Callable[[ModelConfig], list[tuple[str, int]]]


PER_LAYER_KEYS = ("attention.head_count", "attention.head_count_kv", "feed_forward_length")


class GGUFMeta:
    """A GGUF's metadata as a family reads it: ``get("attention.head_count")`` reads the
    architecture-prefixed key."""

    def __init__(self, meta: Mapping, arch: str, path: Path, tensor_names: set[str]):
        self.meta, self.arch, self.path, self.tensor_names = meta, arch, path, tensor_names

    def get(self, key: str, default=None, required: bool = False):
        full = f"{self.arch}.{key}"
        if full not in self.meta:
            if required:
                raise MissingMetadata(
                    self.path, f"metadata key {full}, which the {self.arch} architecture needs, is missing"
                )
            return default
        value = self.meta[full]
        if hasattr(value, "shape") and key in PER_LAYER_KEYS:  # GGUF allows per-layer head and FFN sizes
            raise UnsupportedModelError(
                f"{self.path}: metadata key {full} gives one value per layer; this engine "
                f"runs models whose layers all have the same sizes"
            )
        return value.tolist() if hasattr(value, "shape") else value

    def raw(self, key: str, default=None):
        return self.meta.get(key, default)


@dataclass(frozen=True)
class Family:
    name: str
    gguf_archs: tuple[str, ...]
    hf_model_types: tuple[str, ...]
    hf_architectures: tuple[str, ...] = ()  # config.json "architectures", for files without model_type
    # extra ModelConfig fields: from GGUF metadata (given the common fields) / from config.json
    gguf_fields: Callable[[GGUFMeta, dict], dict] = lambda m, base: {}
    hf_fields: Callable[[dict, dict], dict] = lambda c, base: {}
    gguf_tensors: Mapping[str, str] = field(default_factory=dict)  # GGUF block tensor → engine sub-name
    hf_tensors: Mapping[str, str] = field(default_factory=dict)  # HF layer tensor → engine sub-name
    gguf_fused: Mapping[str, Split] = field(default_factory=dict)  # GGUF block tensor → its row split
    hf_fused: Mapping[str, Split] = field(default_factory=dict)
    hf_norm_offset: float = 0.0  # added to HF norm weights (Gemma stores w and computes x·(1+w))

    def config_from_gguf(self, m: GGUFMeta) -> ModelConfig:
        base = _common_gguf(m)
        keys = {f: f"{m.arch}.{k}" for f, k in GGUF_KEYS.items()}
        _build(m.path, base, keys)  # sizes checked before a family divides by them
        return _build(m.path, {**base, "arch": self.name, **self.gguf_fields(m, base)}, keys)

    def config_from_hf(self, cfg: dict, path: Path) -> ModelConfig:
        try:
            base = _common_hf(cfg, path)
            _build(Path(path) / "config.json", base, HF_KEYS)
            return _build(Path(path) / "config.json", {**base, "arch": self.name, **self.hf_fields(cfg, base)}, HF_KEYS)
        except (KeyError, TypeError, ValueError) as e:
            raise ModelFormatError(f"{path}/config.json: missing or invalid field {e}") from e


_BY_GGUF: dict[str, Family] = {}
_BY_HF: dict[str, Family] = {}
_BY_NAME: dict[str, Family] = {}
_BY_HF_CLASS: dict[str, Family] = {}


def register(family: Family) -> Family:
    _BY_NAME[family.name] = family
    _BY_GGUF.update({a: family for a in family.gguf_archs})
    _BY_HF.update({t: family for t in family.hf_model_types})
    _BY_HF_CLASS.update({a: family for a in family.hf_architectures})
    return family


def _load_all() -> None:
    if len(_BY_NAME) < len(FAMILY_MODULES):
        for mod in FAMILY_MODULES:
            importlib.import_module(f"opscope.engine.models.families.{mod}")


def supported_gguf_archs() -> list[str]:
    _load_all()
    return sorted(_BY_GGUF)


def supported_hf_types() -> list[str]:
    _load_all()
    return sorted(_BY_HF)


def get(name: str) -> Family:
    _load_all()
    return _BY_NAME[name]


def family_for_gguf(arch: str, path) -> Family:
    _load_all()
    if arch not in _BY_GGUF:
        raise UnsupportedModelError(
            f"{path}: architecture {arch!r} is not supported (supported: {', '.join(supported_gguf_archs())})"
        )
    return _BY_GGUF[arch]


def family_for_hf(cfg: dict, path) -> Family:
    _load_all()
    kind = cfg.get("model_type")
    arch = (cfg.get("architectures") or [None])[0]
    if kind is None and arch in _BY_HF_CLASS:
        return _BY_HF_CLASS[arch]
    if kind not in _BY_HF:
        raise UnsupportedModelError(
            f"{path}: model_type {kind!r} ({arch}) is not supported (supported: {', '.join(supported_hf_types())})"
        )
    return _BY_HF[kind]


# -- the fields every family shares ------------------------------------------------------------------
def _common_gguf(m: GGUFMeta) -> dict:
    n_heads = int(m.get("attention.head_count", required=True))
    vocab = int(m.get("vocab_size", 0) or 0) or len(m.raw("tokenizer.ggml.tokens") or ())
    return dict(
        dim=int(m.get("embedding_length", required=True)),
        n_layers=int(m.get("block_count", required=True)),
        n_heads=n_heads,
        n_kv_heads=int(m.get("attention.head_count_kv", n_heads)),
        hidden_dim=int(m.get("feed_forward_length", required=True)),
        vocab_size=vocab,
        head_dim=int(m.get("attention.key_length", 0) or 0),
        norm_eps=float(m.get("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(m.get("rope.freq_base", 10000.0)),
        rope_scaling=_gguf_rope_scaling(m),
        max_seq_len=int(m.get("context_length", 2048)),
        tie_embeddings="output.weight" not in m.tensor_names,
        qkv_bias="blk.0.attn_q.bias" in m.tensor_names or "blk.0.attn_qkv.bias" in m.tensor_names,
    )


def _gguf_rope_scaling(m: GGUFMeta) -> RopeScaling | None:
    kind = m.get("rope.scaling.type")
    if kind in (None, "none"):
        return None
    if kind != "linear":
        raise UnsupportedModelError(f"{m.path}: rope scaling type {kind!r} is not supported (linear is)")
    return RopeScaling("linear", factor=float(m.get("rope.scaling.factor", 1.0)))


def _common_hf(cfg: dict, path: Path) -> dict:
    n_heads = int(cfg["num_attention_heads"])
    return dict(
        dim=int(cfg["hidden_size"]),
        n_layers=int(cfg["num_hidden_layers"]),
        n_heads=n_heads,
        n_kv_heads=int(cfg.get("num_key_value_heads") or n_heads),
        hidden_dim=int(cfg["intermediate_size"]),
        vocab_size=int(cfg["vocab_size"]),
        head_dim=int(cfg.get("head_dim") or 0),
        norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
        rope_theta=float(hf_rope_theta(cfg, "full_attention", 10000.0)),
        rope_scaling=hf_rope_scaling(hf_rope_params(cfg, "full_attention"), path),
        max_seq_len=int(cfg.get("max_position_embeddings", 2048)),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=bool(cfg.get("attention_bias", False)),
    )


def hf_rope_params(cfg: dict, layer_type: str) -> dict | None:
    """RoPE parameters of ``layer_type`` layers: transformers ≥5 ``rope_parameters`` (flat, or one
    dict per layer type as Gemma 3 writes it) or the older ``rope_scaling``."""
    rp = cfg.get("rope_parameters")
    if isinstance(rp, dict) and layer_type in rp:
        return rp[layer_type]
    return rp if isinstance(rp, dict) and rp else cfg.get("rope_scaling")


def hf_rope_theta(cfg: dict, layer_type: str, default: float) -> float:
    rp = hf_rope_params(cfg, layer_type) or {}
    return float(rp.get("rope_theta") or cfg.get("rope_theta") or default)


def hf_rope_scaling(rs: dict | None, path: Path) -> RopeScaling | None:
    if not rs:
        return None
    kind = rs.get("rope_type") or rs.get("type")
    if kind in ("default", None):
        return None
    if kind == "linear":
        return RopeScaling("linear", factor=float(rs["factor"]))
    if kind == "llama3":
        return RopeScaling(
            "llama3",
            factor=float(rs["factor"]),
            low_freq_factor=float(rs["low_freq_factor"]),
            high_freq_factor=float(rs["high_freq_factor"]),
            original_max_position=int(rs["original_max_position_embeddings"]),
        )
    raise UnsupportedModelError(f"{path}: rope scaling {kind!r} is not supported (linear, llama3 are)")


def hf_layer_windows(cfg: dict, window: int, pattern: int) -> tuple[int, ...]:
    """Per-layer windows from config.json's ``layer_types`` (or every ``pattern``-th layer global)."""
    types = cfg.get("layer_types") or [
        "full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
        for i in range(int(cfg["num_hidden_layers"]))
    ]
    return tuple(window if t == "sliding_attention" else 0 for t in types)


def pattern_windows(n_layers: int, window: int, pattern) -> tuple[int, ...]:
    """llama.cpp's swa pattern: an int n (layer i is local unless i % n == n-1) or a list of bools."""
    if isinstance(pattern, (list, tuple)):
        return tuple(window if bool(p) else 0 for p in pattern)
    n = int(pattern)
    return tuple(window if n == 0 or i % n < n - 1 else 0 for i in range(n_layers))


# ModelConfig field → the key it is read from, to name it in errors
GGUF_KEYS = {
    "dim": "embedding_length",
    "n_layers": "block_count",
    "n_heads": "attention.head_count",
    "n_kv_heads": "attention.head_count_kv",
    "hidden_dim": "feed_forward_length",
    "vocab_size": "vocab_size",
    "head_dim": "attention.key_length",
    "max_seq_len": "context_length",
    "norm_eps": "attention.layer_norm_rms_epsilon",
    "rope_theta": "rope.freq_base",
}
HF_KEYS = {
    "dim": "hidden_size",
    "n_layers": "num_hidden_layers",
    "n_heads": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads",
    "hidden_dim": "intermediate_size",
    "vocab_size": "vocab_size",
    "head_dim": "head_dim",
    "max_seq_len": "max_position_embeddings",
    "norm_eps": "rms_norm_eps",
    "rope_theta": "rope_theta",
}


def _build(path, fields: dict, keys: Mapping[str, str] = {}) -> ModelConfig:
    try:
        return ModelConfig(**fields)
    except ModelLoadError as e:
        field_name = e.detail.split(" ", 1)[0]
        detail = f"{keys[field_name]}{e.detail[len(field_name) :]}" if field_name in keys else e.detail
        raise type(e)(path, detail, e.fix) from e
    except UnsupportedModelError as e:
        raise UnsupportedModelError(f"{path}: {e}") from e
