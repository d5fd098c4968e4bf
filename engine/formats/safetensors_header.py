"""Bounds-checked reader of a safetensors header (an 8-byte length, then a JSON table), checked
before the ``safetensors`` library maps the file: every tensor's dtype known, its shape a list of
non-negative integers, its byte range of the size dtype × shape implies, and the ranges contiguous
from 0 to the end of the file (what the format requires), with no name given twice.

Then ``check_hf_tensors``, once config.json is read and still before anything is mapped: every
tensor the architecture needs is in some shard, each with the shape config.json implies (a wrong
shape would otherwise surface only when the model is built, after every shard was mapped), and no
layer beyond ``num_hidden_layers``."""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from opscope.engine.core.errors import (
    BadMagic,
    DuplicateEntry,
    InvalidHyperparameters,
    LimitExceeded,
    MissingTensor,
    TensorOutOfBounds,
    TensorOverlap,
    Truncated,
    WrongMetadataType,
)
from opscope.engine.formats.files import check_regular_file, unique_keys

if TYPE_CHECKING:
    from opscope.engine.models.config import ModelConfig
    from opscope.engine.models.families import Family

MAX_HEADER_BYTES = 100_000_000  # the safetensors library's own limit
MAX_DIMS = 8
DTYPE_BYTES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "F8_E8M0": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "F64": 8,
    "I64": 8,
    "U64": 8,
}


@dataclass(frozen=True)
class SafetensorsEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # byte offsets relative to the data section
    end: int


def read_safetensors_header(path: Path) -> list[SafetensorsEntry]:
    return read_safetensors_table(path)[0]


def read_safetensors_table(path: Path) -> tuple[list[SafetensorsEntry], dict[str, str]]:
    """The checked tensor entries and the ``__metadata__`` strings ({} when absent)."""
    size = check_regular_file(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise Truncated(path, f"file is {size} bytes, shorter than a safetensors header length (8 bytes)")
        (n,) = struct.unpack("<Q", head)
        if n > MAX_HEADER_BYTES:
            raise LimitExceeded(path, f"header length {n} (at byte 0) exceeds the safetensors limit {MAX_HEADER_BYTES}")
        if n > size - 8:
            raise Truncated(path, f"header of {n} bytes runs past the end of the file ({size} bytes)")
        raw = f.read(n)
    if not raw.lstrip().startswith(b"{"):
        raise BadMagic(path, f"not a safetensors file (header starts {raw[:8]!r}, expected a JSON object)")
    try:
        table = json.loads(raw.decode("utf-8"), object_pairs_hook=unique_keys(path, "the JSON header"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        if isinstance(e, DuplicateEntry):
            raise
        raise WrongMetadataType(path, f"the JSON header is not valid JSON ({e})") from None
    if not isinstance(table, dict):
        raise WrongMetadataType(path, "the JSON header is not an object of tensors")
    entries = [_entry(path, k, v) for k, v in table.items() if k != "__metadata__"]
    _check_metadata(path, table.get("__metadata__"))
    _check_layout(path, entries, size - 8 - n)
    return entries, table.get("__metadata__") or {}


def _entry(path: Path, name: str, v: object) -> SafetensorsEntry:
    if not isinstance(v, dict):
        raise WrongMetadataType(path, f"tensor {name}: entry is a {type(v).__name__}, not an object")
    dtype, shape, offsets = v.get("dtype"), v.get("shape"), v.get("data_offsets")
    if dtype not in DTYPE_BYTES:
        raise WrongMetadataType(path, f"tensor {name} has dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}")
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_DIMS
        or not all(type(d) is int and 0 <= d < 1 << 40 for d in shape)
    ):
        raise WrongMetadataType(
            path, f"tensor {name} has shape {shape!r}; a shape is a list of at most {MAX_DIMS} non-negative integers"
        )
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int and o >= 0 for o in offsets)):
        raise WrongMetadataType(path, f"tensor {name} has data_offsets {offsets!r}; expected [begin, end]")
    begin, end = offsets
    numel = 1
    for d in shape:
        numel *= d
    if end - begin != numel * DTYPE_BYTES[dtype]:
        raise TensorOutOfBounds(
            path,
            f"tensor {name} spans bytes {begin}..{end} ({end - begin} bytes) but "
            f"{dtype} × {tuple(shape)} needs {numel * DTYPE_BYTES[dtype]}",
        )
    return SafetensorsEntry(name, dtype, tuple(shape), begin, end)


def _check_metadata(path: Path, meta: object) -> None:
    if meta is not None and not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
        raise WrongMetadataType(path, "__metadata__ must map strings to strings")


def _check_layout(path: Path, entries: list[SafetensorsEntry], data_bytes: int) -> None:
    prev: SafetensorsEntry | None = None
    for e in sorted(entries, key=lambda e: (e.begin, e.end)):
        at = prev.end if prev else 0
        if prev is not None and e.begin < at:  # at > 0 only after a previous tensor
            raise TensorOverlap(
                path,
                f"tensor {e.name} (bytes {e.begin}..{e.end}) overlaps tensor {prev.name} "
                f"(bytes {prev.begin}..{prev.end})",
            )
        if e.begin > at:
            raise TensorOutOfBounds(
                path,
                f"tensor {e.name} starts at byte {e.begin}, leaving a gap after byte "
                f"{at}; safetensors tensors must be contiguous",
            )
        prev = e
    end = prev.end if prev else 0
    if prev is not None and end > data_bytes:
        raise Truncated(
            path, f"tensor {prev.name} ends at data byte {end} but the file holds {data_bytes} bytes of data"
        )
    if end < data_bytes:
        raise TensorOutOfBounds(
            path,
            f"the tensors cover {end} bytes but the data section holds {data_bytes}; "
            f"safetensors data must be exactly the tensors",
        )


# -- the tensors against config.json ------------------------------------------------------------------
_LAYER_KEY = re.compile(r"model\.layers\.(\d+)\.(.+\.(?:weight|bias))$")
_DISAGREE = (
    "config.json and the weights disagree: use the config.json that came with these weights, "
    "or download the model again"
)
_MISSING = "the weights are incomplete: download every shard again, or convert the model again"


def _layer_shapes(cfg: ModelConfig, family: Family) -> dict[str, tuple[int, ...]]:
    """HF layer tensor (``self_attn.q_proj.weight``) → its shape [out, in] under ``cfg``."""
    D, F, hd = cfg.dim, cfg.hidden_dim, cfg.head_dim
    q, kv = cfg.n_heads * hd, cfg.n_kv_heads * hd
    shapes = {
        "input_layernorm.weight": (D,),
        "post_attention_layernorm.weight": (D,),
        "pre_feedforward_layernorm.weight": (D,),
        "post_feedforward_layernorm.weight": (D,),
        "self_attn.q_norm.weight": (hd,),
        "self_attn.k_norm.weight": (hd,),
        "self_attn.q_proj.weight": (q, D),
        "self_attn.k_proj.weight": (kv, D),
        "self_attn.v_proj.weight": (kv, D),
        "self_attn.o_proj.weight": (D, q),
        "self_attn.q_proj.bias": (q,),
        "self_attn.k_proj.bias": (kv,),
        "self_attn.v_proj.bias": (kv,),
        "mlp.gate_proj.weight": (F, D),
        "mlp.up_proj.weight": (F, D),
        "mlp.down_proj.weight": (D, F),
    }
    for name, split in family.hf_fused.items():
        rows = sum(r for _, r in split(cfg))
        shapes[f"{name}.weight"], shapes[f"{name}.bias"] = (rows, D), (rows,)
    return shapes


def _layer_required(cfg: ModelConfig, family: Family) -> list[str]:
    fused = family.hf_fused
    names = ["input_layernorm", "post_attention_layernorm", "self_attn.o_proj", "mlp.down_proj"]
    names += (
        ["self_attn.qkv_proj"]
        if "self_attn.qkv_proj" in fused
        else ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"]
    )
    names += ["mlp.gate_up_proj"] if "mlp.gate_up_proj" in fused else ["mlp.gate_proj", "mlp.up_proj"]
    names += ["self_attn.q_norm", "self_attn.k_norm"] if cfg.qk_norm else []
    names += ["pre_feedforward_layernorm", "post_feedforward_layernorm"] if cfg.post_norms else []
    weights = [f"{n}.weight" for n in names]
    if cfg.qkv_bias and "self_attn.qkv_proj" not in fused:
        weights += [f"self_attn.{n}_proj.bias" for n in "qkv"]
    return weights


def check_hf_tensors(
    where: Path, headers: dict[Path, list[SafetensorsEntry]], family: Family, cfg: ModelConfig
) -> None:
    """``headers``: shard → its entries; ``where``: the directory (or the one file) for a missing
    tensor. MissingTensor for a tensor the architecture needs and no shard holds;
    InvalidHyperparameters (naming the shard and the tensor) for a shape config.json contradicts
    or a layer beyond its ``num_hidden_layers``."""
    top = {
        "model.embed_tokens.weight": (cfg.vocab_size, cfg.dim),
        "model.norm.weight": (cfg.dim,),
        "lm_head.weight": (cfg.vocab_size, cfg.dim),
    }
    layer = _layer_shapes(cfg, family)
    held: set[str] = set()
    for shard, entries in headers.items():
        for e in entries:
            held.add(e.name)
            m = _LAYER_KEY.match(e.name)
            if m and int(m.group(1)) >= cfg.n_layers:
                raise InvalidHyperparameters(
                    shard,
                    f"tensor {e.name} lies beyond the {cfg.n_layers} layers that "
                    f"config.json's num_hidden_layers declares",
                    _DISAGREE,
                )
            want = layer.get(m.group(2)) if m else top.get(e.name)
            if want is not None and e.shape != want:
                raise InvalidHyperparameters(
                    shard,
                    f"tensor {e.name} has shape {list(e.shape)} but config.json's sizes imply {list(want)}",
                    _DISAGREE,
                )
    needed = ["model.embed_tokens.weight", "model.norm.weight"] + ([] if cfg.tie_embeddings else ["lm_head.weight"])
    needed += [f"model.layers.{i}.{n}" for i in range(cfg.n_layers) for n in _layer_required(cfg, family)]
    missing = [n for n in needed if n not in held]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise MissingTensor(where, f"tensor {missing[0]}{more} is in no safetensors file of the model", _MISSING)
