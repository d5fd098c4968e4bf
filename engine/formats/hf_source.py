"""Hugging Face model directories: config.json + *.safetensors (single or sharded) + tokenizer files."""
from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Iterator

import numpy as np

from engine.errors import ModelFormatError, UnsupportedModelError
from engine.models.config import ModelConfig, RopeScaling

_HF_ARCHS = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2"}
_TOP = {"model.embed_tokens.weight": "embed.weight", "model.norm.weight": "norm.weight",
        "lm_head.weight": "lm_head.weight"}
_LAYER = {"input_layernorm": "attn_norm", "post_attention_layernorm": "mlp_norm",
          "self_attn.q_proj": "attn.q_proj", "self_attn.k_proj": "attn.k_proj",
          "self_attn.v_proj": "attn.v_proj", "self_attn.o_proj": "attn.o_proj",
          "mlp.gate_proj": "mlp.gate_proj", "mlp.up_proj": "mlp.up_proj", "mlp.down_proj": "mlp.down_proj"}
_LAYER_RE = re.compile(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)$")
ENGINE_TO_HF = {v: k for k, v in _TOP.items()}


def engine_name(hf_name: str) -> str | None:
    if hf_name in _TOP:
        return _TOP[hf_name]
    m = _LAYER_RE.match(hf_name)
    if m and m.group(2) in _LAYER:
        return f"layers.{m.group(1)}.{_LAYER[m.group(2)]}.{m.group(3)}"
    return None


def hf_name(engine: str) -> str:
    """Inverse of engine_name (used to write HF directories from an engine state dict)."""
    if engine in ENGINE_TO_HF:
        return ENGINE_TO_HF[engine]
    m = re.match(r"layers\.(\d+)\.(.+)\.(weight|bias)$", engine)
    inv = {v: k for k, v in _LAYER.items()}
    return f"model.layers.{m.group(1)}.{inv[m.group(2)]}.{m.group(3)}"


def config_from_hf(cfg: dict, path: Path) -> ModelConfig:
    arch = _HF_ARCHS.get((cfg.get("architectures") or ["?"])[0]) or cfg.get("model_type")
    if arch not in ("llama", "mistral", "qwen2"):
        raise UnsupportedModelError(f"{path}: architecture {cfg.get('architectures')} is not supported "
                                    f"(Llama, Mistral, Qwen2 are)")
    try:
        n_heads = int(cfg["num_attention_heads"])
        return ModelConfig(
            arch=arch, dim=int(cfg["hidden_size"]), n_layers=int(cfg["num_hidden_layers"]), n_heads=n_heads,
            n_kv_heads=int(cfg.get("num_key_value_heads") or n_heads),
            hidden_dim=int(cfg["intermediate_size"]), vocab_size=int(cfg["vocab_size"]),
            head_dim=int(cfg.get("head_dim") or 0), norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
            rope_theta=float(cfg.get("rope_theta", 10000.0)), rope_scaling=_rope(cfg.get("rope_scaling"), path),
            max_seq_len=int(cfg.get("max_position_embeddings", 2048)),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qkv_bias=arch == "qwen2" or bool(cfg.get("attention_bias", False)))
    except (KeyError, TypeError, ValueError) as e:
        raise ModelFormatError(f"{path}/config.json: missing or invalid field {e}") from e


def _rope(rs: dict | None, path: Path) -> RopeScaling | None:
    if not rs:
        return None
    kind = rs.get("rope_type") or rs.get("type")
    if kind in ("default", None):
        return None
    if kind == "linear":
        return RopeScaling("linear", factor=float(rs["factor"]))
    if kind == "llama3":
        return RopeScaling("llama3", factor=float(rs["factor"]), low_freq_factor=float(rs["low_freq_factor"]),
                           high_freq_factor=float(rs["high_freq_factor"]),
                           original_max_position=int(rs["original_max_position_embeddings"]))
    raise UnsupportedModelError(f"{path}: rope scaling {kind!r} is not supported (linear, llama3 are)")


class HFDirSource:
    format = "safetensors"

    def __init__(self, path: Path):
        self.path = path
        cfg_path = path / "config.json"
        if not cfg_path.is_file():
            raise ModelFormatError(f"{path}: no config.json — not a Hugging Face model directory")
        try:
            cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ModelFormatError(f"{cfg_path}: not valid JSON: {e}") from e
        self.config = config_from_hf(cfg, path)
        self.shards = self._shards()
        self.file_size_bytes = sum(s.stat().st_size for s in self.shards)
        self.meta = {"config": cfg}
        self._dtypes: Counter = Counter()

    def _shards(self) -> list[Path]:
        index = self.path / "model.safetensors.index.json"
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            except (json.JSONDecodeError, KeyError, UnicodeDecodeError) as e:
                raise ModelFormatError(f"{index}: invalid shard index: {e}") from e
            shards = sorted({self.path / Path(f).name for f in weight_map.values()})
        else:
            shards = sorted(self.path.glob("*.safetensors"))
        if not shards:
            raise ModelFormatError(f"{self.path}: no *.safetensors files")
        missing = [s for s in shards if not s.is_file()]
        if missing:
            raise ModelFormatError(f"{missing[0]}: shard listed in the index is missing")
        return shards

    @property
    def chat_template(self) -> str | None:
        return None  # read by the tokenizer from tokenizer_config.json

    @property
    def quant_summary(self) -> dict[str, int]:
        from safetensors import safe_open

        counts: Counter = Counter()
        for shard in self.shards:
            with _open(shard, safe_open) as f:
                for k in f.keys():
                    counts[str(f.get_slice(k).get_dtype())] += 1
        return dict(counts)

    def iter_tensors(self) -> Iterator[tuple[str, "np.ndarray"]]:
        """(engine name, torch tensor) — safetensors loads bf16 too, which numpy cannot hold."""
        from safetensors import safe_open

        for shard in self.shards:
            with _open(shard, safe_open) as f:
                for key in f.keys():
                    name = engine_name(key)
                    if name is None:
                        continue
                    try:
                        yield name, f.get_tensor(key)
                    except Exception as e:
                        raise ModelFormatError(f"{shard}: tensor {key} is corrupt: {e}") from e


def _open(shard: Path, safe_open):
    try:
        return safe_open(str(shard), framework="pt")
    except Exception as e:
        raise ModelFormatError(f"{shard}: not a valid safetensors file: {e}") from e
