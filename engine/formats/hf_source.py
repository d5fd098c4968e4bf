"""Hugging Face model directories: config.json + *.safetensors (single or sharded) + tokenizer files."""
from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Iterator

import numpy as np

from engine.errors import ModelFormatError
from engine.models.config import ModelConfig

_TOP = {"model.embed_tokens.weight": "embed.weight", "model.norm.weight": "norm.weight",
        "lm_head.weight": "lm_head.weight"}
_LAYER = {"input_layernorm": "attn_norm", "post_attention_layernorm": "mlp_norm",
          "self_attn.q_proj": "attn.q_proj", "self_attn.k_proj": "attn.k_proj",
          "self_attn.v_proj": "attn.v_proj", "self_attn.o_proj": "attn.o_proj",
          "mlp.gate_proj": "mlp.gate_proj", "mlp.up_proj": "mlp.up_proj", "mlp.down_proj": "mlp.down_proj"}
_LAYER_RE = re.compile(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)$")
ENGINE_TO_HF = {v: k for k, v in _TOP.items()}


def _layer_map(family) -> dict[str, str]:
    return {**_LAYER, **family.hf_tensors} if family is not None else _LAYER


def engine_name(hf_name: str, family=None) -> str | None:
    """Engine parameter name of a Hugging Face tensor (``family``: its extra names), None if unknown."""
    if hf_name in _TOP:
        return _TOP[hf_name]
    m = _LAYER_RE.match(hf_name)
    layer = _layer_map(family)
    if m and m.group(2) in layer:
        return f"layers.{m.group(1)}.{layer[m.group(2)]}.{m.group(3)}"
    return None


def hf_name(engine: str, family=None) -> str:
    """Inverse of engine_name (used to write HF directories from an engine state dict)."""
    if engine in ENGINE_TO_HF:
        return ENGINE_TO_HF[engine]
    m = re.match(r"layers\.(\d+)\.(.+)\.(weight|bias)$", engine)
    inv = {v: k for k, v in _layer_map(family).items()}
    return f"model.layers.{m.group(1)}.{inv[m.group(2)]}.{m.group(3)}"


def config_from_hf(cfg: dict, path: Path) -> ModelConfig:
    """ModelConfig of a config.json, read by the family registered for its ``model_type``."""
    from engine.models.families import family_for_hf

    return family_for_hf(cfg, path).config_from_hf(cfg, path)


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
        from engine.models.families import family_for_hf

        self.family = family_for_hf(cfg, path)
        self.config = self.family.config_from_hf(cfg, path)
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
                    yield from self._pieces(shard, key, f)

    def _pieces(self, shard: Path, key: str, f) -> Iterator[tuple[str, "np.ndarray"]]:
        m = _LAYER_RE.match(key)
        split = self.family.hf_fused.get(m.group(2)) if m else None
        name = engine_name(key, self.family)
        if name is None and split is None:
            return
        try:
            t = f.get_tensor(key)
        except Exception as e:
            raise ModelFormatError(f"{shard}: tensor {key} is corrupt: {e}") from e
        if self.family.hf_norm_offset and key.endswith("norm.weight"):
            t = t.float() + self.family.hf_norm_offset  # Gemma computes x·(1+w); the core computes x·w
        if split is None:
            yield name, t
            return
        row = 0
        for sub, rows in split(self.config):  # fused q|k|v, gate|up (Phi-3): rows of the core's linears
            yield f"layers.{m.group(1)}.{sub}.{m.group(3)}", t[row:row + rows]
            row += rows


def _open(shard: Path, safe_open):
    try:
        return safe_open(str(shard), framework="pt")
    except Exception as e:
        raise ModelFormatError(f"{shard}: not a valid safetensors file: {e}") from e
