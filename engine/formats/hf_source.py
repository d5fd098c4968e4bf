"""Hugging Face model directories: config.json + *.safetensors (single or sharded) + tokenizer files."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from opscope.engine.core.errors import MissingMetadata, MissingTensor, ModelFormatError, UnsafeFormat, WrongMetadataType
from opscope.engine.formats.files import PICKLE_SUFFIXES, json_type, read_json_object, refuse_pickle
from opscope.engine.formats.gguf_spec import article
from opscope.engine.formats.safetensors_header import check_hf_tensors, read_safetensors_header
from opscope.engine.models.config import ModelConfig

if TYPE_CHECKING:
    from opscope.engine.models.families import Family
    from opscope.engine.tokenizer.loader import Tokenizer

_TOP = {
    "model.embed_tokens.weight": "embed.weight",
    "model.norm.weight": "norm.weight",
    "lm_head.weight": "lm_head.weight",
}
_LAYER = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "mlp_norm",
    "self_attn.q_proj": "attn.q_proj",
    "self_attn.k_proj": "attn.k_proj",
    "self_attn.v_proj": "attn.v_proj",
    "self_attn.o_proj": "attn.o_proj",
    "mlp.gate_proj": "mlp.gate_proj",
    "mlp.up_proj": "mlp.up_proj",
    "mlp.down_proj": "mlp.down_proj",
}
_LAYER_RE = re.compile(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)$")
ENGINE_TO_HF = {v: k for k, v in _TOP.items()}


def _layer_map(family: Family | None) -> dict[str, str]:
    return {**_LAYER, **family.hf_tensors} if family is not None else _LAYER


def engine_name(hf_name: str, family: Family | None = None) -> str | None:
    """Engine parameter name of a Hugging Face tensor (``family``: its extra names), None if unknown."""
    if hf_name in _TOP:
        return _TOP[hf_name]
    m = _LAYER_RE.match(hf_name)
    layer = _layer_map(family)
    if m and m.group(2) in layer:
        return f"layers.{m.group(1)}.{layer[m.group(2)]}.{m.group(3)}"
    return None


def hf_name(engine: str, family: Family | None = None) -> str:
    """Inverse of engine_name (used to write HF directories from an engine state dict)."""
    if engine in ENGINE_TO_HF:
        return ENGINE_TO_HF[engine]
    m = re.match(r"layers\.(\d+)\.(.+)\.(weight|bias)$", engine)
    if m is None:
        raise KeyError(f"{engine!r} is not an engine parameter name")
    inv = {v: k for k, v in _layer_map(family).items()}
    return f"model.layers.{m.group(1)}.{inv[m.group(2)]}.{m.group(3)}"


def config_from_hf(cfg: dict, path: Path) -> ModelConfig:
    """ModelConfig of a config.json, read by the family registered for its ``model_type``."""
    from opscope.engine.models.families import family_for_hf

    return family_for_hf(cfg, path).config_from_hf(cfg, path)


# config.json fields the engine reads → the JSON types allowed (None is "not set" for optional ones)
_INT, _NUM, _BOOL = (int,), (int, float), (bool,)
CONFIG_TYPES = {
    "hidden_size": _INT,
    "num_hidden_layers": _INT,
    "num_attention_heads": _INT,
    "num_key_value_heads": _INT,
    "intermediate_size": _INT,
    "vocab_size": _INT,
    "head_dim": _INT,
    "max_position_embeddings": _INT,
    "sliding_window": _INT,
    "sliding_window_pattern": _INT,
    "query_pre_attn_scalar": _NUM,
    "rms_norm_eps": _NUM,
    "rope_theta": _NUM,
    "attn_logit_softcapping": _NUM,
    "final_logit_softcapping": _NUM,
    "rope_local_base_freq": _NUM,
    "partial_rotary_factor": _NUM,
    "tie_word_embeddings": _BOOL,
    "attention_bias": _BOOL,
    "model_type": (str,),
}
CONFIG_REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")


def read_config_json(path: Path) -> dict:
    """config.json parsed with every key unique and every field the engine reads of its JSON type
    (a number given as a string is an error, not a silent int())."""
    cfg = read_json_object(path)
    for key, types in CONFIG_TYPES.items():
        v = cfg.get(key)
        if v is None:
            if key in CONFIG_REQUIRED:
                raise MissingMetadata(path, f"field {key} is missing")
            continue
        if isinstance(v, bool) and bool not in types or not isinstance(v, types):
            raise WrongMetadataType(
                path,
                f"field {key} is {v!r} (a JSON {_json_type(v)}); it must be "
                f"{' or '.join(article(_json_type(t())) for t in types)}",
            )
    return cfg


_json_type = json_type


def _shown(v: object) -> str:
    text = json.dumps(v) if isinstance(v, (str, int, float, bool, type(None))) else f"a JSON {json_type(v)}"
    return text if len(text) <= 80 else text[:80] + "…"


class HFDirSource:
    format = "safetensors"
    tokenizer: Tokenizer  # attached by engine.formats.open_model

    def __init__(self, path: Path, only: Path | None = None):
        """``path``: the model directory; ``only``: one .safetensors file in it to load alone."""
        self.path = only if only is not None else path
        self.directory = path
        cfg_path = path / "config.json"
        if not cfg_path.is_file():
            where = f"{only.name} has no config.json beside it" if only is not None else "no config.json"
            raise MissingMetadata(
                self.path,
                f"{where} — not a Hugging Face model",
                "put the model's config.json (and tokenizer files) in the same directory",
            )
        self.shards = [only] if only is not None else self._shards()
        cfg = read_config_json(cfg_path)
        from opscope.engine.models.families import family_for_hf

        self.family = family_for_hf(cfg, path)
        self.config = self.family.config_from_hf(cfg, path)
        self.headers = {s: read_safetensors_header(s) for s in self.shards}
        check_hf_tensors(self.path, self.headers, self.family, self.config)  # before any shard is mapped
        self.file_size_bytes = sum(s.stat().st_size for s in self.shards)
        self.meta = {"config": cfg}
        self._dtypes: Counter = Counter()

    def _shards(self) -> list[Path]:
        index = self.directory / "model.safetensors.index.json"
        if index.exists():
            weight_map = read_json_object(index).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise (MissingMetadata if weight_map is None else WrongMetadataType)(
                    index,
                    f"field weight_map is {_shown(weight_map)}; it must be a non-empty object mapping "
                    f"tensor names to shard files",
                    "fix the index, or download it again",
                )
            shards = sorted({self._inside(index, f) for f in weight_map.values()})
        else:
            shards = sorted(self.directory.glob("*.safetensors"))
        if not shards:
            pickles = sorted(f for f in self.directory.iterdir() if f.suffix in PICKLE_SUFFIXES)
            if pickles:
                raise refuse_pickle(pickles[0])
            raise ModelFormatError(f"{self.directory}: no *.safetensors files")
        missing = [s for s in shards if not s.exists()]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise MissingTensor(
                missing[0],
                f"shard {missing[0].name}{more} listed in model.safetensors.index.json is missing",
                "the download is incomplete: download every shard the index lists",
            )
        return shards

    def _inside(self, index: Path, name: object) -> Path:
        """A shard path of the index, refused unless it names a file inside the model directory."""
        if not isinstance(name, str):
            raise WrongMetadataType(
                index,
                f"weight_map holds {_shown(name)} where a shard file name belongs",
                "fix the index, or download it again",
            )
        rel = Path(name)
        if rel.is_absolute() or ".." in rel.parts or not rel.parts or "\0" in name:
            raise UnsafeFormat(
                index,
                f"shard path {name!r} in weight_map leaves the model directory",
                "shards must be files inside the model directory; fix the index",
            )
        # A shard may be a symlink out of the directory (the Hugging Face cache links snapshots to
        # ../../blobs/); what it points at must still be a regular file, which every reader checks.
        return self.directory / rel

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

    def iter_tensors(self) -> Iterator[tuple[str, np.ndarray]]:
        """(engine name, torch tensor) — safetensors loads bf16 too, which numpy cannot hold."""
        from safetensors import safe_open

        for shard in self.shards:
            with _open(shard, safe_open) as f:
                for key in f.keys():
                    yield from self._pieces(shard, key, f)

    def _pieces(self, shard: Path, key: str, f: Any) -> Iterator[tuple[str, np.ndarray]]:  # f: safe_open's handle
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
        if m is None or split is None:  # split is None without a layer match
            if name is not None:
                yield name, t
            return
        row = 0
        for sub, rows in split(self.config):  # fused q|k|v, gate|up (Phi-3): rows of the core's linears
            yield f"layers.{m.group(1)}.{sub}.{m.group(3)}", t[row : row + rows]
            row += rows


def _open(shard: Path, safe_open: Callable[..., Any]) -> Any:
    try:
        return safe_open(str(shard), framework="pt")
    except Exception as e:
        raise ModelFormatError(f"{shard}: not a valid safetensors file: {e}") from e
