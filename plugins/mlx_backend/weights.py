"""Checkpoint tensors → the MLX Transformer, named as the engine names them.

GGUF files and float safetensors directories are read through the engine's own sources
(``opscope.engine.open_model``): the same family descriptors (extra tensor names, fused q|k|v and
gate|up splits, Gemma's norm offset, Q/K row order) as the torch backend, one registry. GGUF blocks
become MLX arrays tensor by tensor (``convert``: exact repacks, requantization or dense).
MLX-quantized safetensors (``.scales``/``.biases``, as mlx-lm writes them) are read by ``mx.load``
with the name table below. Quantized tensors stay quantized: their modules become
nn.QuantizedLinear / QuantizedEmbedding with the bits and group size read off the tensor shapes.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten
from opscope.engine import ConfigError, ModelFormatError, UnsupportedModelError

log = logging.getLogger(__name__)

GGUF_TOP = {"token_embd": "embed", "output_norm": "norm", "output": "lm_head"}
GGUF_BLOCK = {
    "attn_norm": "attn_norm",
    "attn_q": "attn.q_proj",
    "attn_k": "attn.k_proj",
    "attn_v": "attn.v_proj",
    "attn_output": "attn.o_proj",
    "ffn_norm": "mlp_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
HF_TOP = {"model.embed_tokens": "embed", "model.norm": "norm", "lm_head": "lm_head"}
HF_BLOCK = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn.q_proj",
    "self_attn.k_proj": "attn.k_proj",
    "self_attn.v_proj": "attn.v_proj",
    "self_attn.o_proj": "attn.o_proj",
    "post_attention_layernorm": "mlp_norm",
    "mlp.gate_proj": "mlp.gate_proj",
    "mlp.up_proj": "mlp.up_proj",
    "mlp.down_proj": "mlp.down_proj",
}
_GGUF_BLOCK_RE = re.compile(r"blk\.(\d+)\.(.+)")
_HF_BLOCK_RE = re.compile(r"model\.layers\.(\d+)\.(.+)")
_SUFFIXES = ("weight", "scales", "biases", "bias")
_DTYPES = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}


def mlx_dtype(name: str):
    if name not in _DTYPES:
        raise ConfigError(f"dtype {name!r} is not supported by the mlx backend (supported: {', '.join(_DTYPES)})")
    return _DTYPES[name]


def rename(name: str, fmt: str) -> str | None:
    """Checkpoint tensor name → parameter path in our Transformer; None for tensors we do not use
    (e.g. GGUF ``rope_freqs``, which the model recomputes)."""
    module, _, suffix = name.rpartition(".")
    if suffix not in _SUFFIXES:
        return None
    top, block_re, block = (GGUF_TOP, _GGUF_BLOCK_RE, GGUF_BLOCK) if fmt == "gguf" else (HF_TOP, _HF_BLOCK_RE, HF_BLOCK)
    if module in top:
        return f"{top[module]}.{suffix}"
    m = block_re.fullmatch(module)
    if m and m.group(2) in block:
        return f"layers.{m.group(1)}.{block[m.group(2)]}.{suffix}"
    return None


def read_gguf(source) -> dict[str, mx.array]:
    """Every tensor of a (validated) GGUF source as MLX arrays under engine names; Q/K rows come in
    rotate-half order (``raw_tensor``), the RoPE the model applies for every family."""
    import numpy as np
    from opscope.plugins.mlx_backend.convert import convert

    out: dict[str, mx.array] = {}
    for name in source.tensor_names():
        kind, raw, shape = source.raw_tensor(name)
        parts = convert(kind, raw, shape)
        if name.endswith(("attn.q_proj.bias", "attn.k_proj.bias")) and source.arch == "llama":
            from opscope.engine import permute_qk_rows  # raw_tensor reorders weights only

            heads = source.config.n_heads if "q_proj" in name else source.config.n_kv_heads
            parts["weight"] = parts["weight"][permute_qk_rows(shape[0], heads)]
        module = name[: -len(".weight")] if name.endswith(".weight") else name
        for key, arr in parts.items():
            full = name if key == "weight" else f"{module}.{key}"
            out[full] = arr if isinstance(arr, mx.array) else mx.array(np.ascontiguousarray(arr))
    return out


def read_hf(source) -> dict[str, mx.array]:
    """A safetensors directory: MLX-quantized ones through ``mx.load`` (mlx-lm's layout), float ones
    through the engine's source (family names, fused splits, Gemma's norm offset)."""
    files = list(source.shards)
    if _mlx_quantized(files):
        _refuse_switches(source)
        return read_tensors(files, "hf")
    out = {}
    for name, t in source.iter_tensors():
        out[name] = mx.array(t.float().numpy())
    return out


def _mlx_quantized(files: list[Path]) -> bool:
    from safetensors import safe_open

    for f in files:
        with safe_open(str(f), framework="numpy") as h:
            if any(k.endswith(".scales") for k in h.keys()):
                return True
    return False


def _refuse_switches(source) -> None:
    if not source.config.is_llama_core or source.config.arch == "phi3":
        raise UnsupportedModelError(
            f"{source.path}: the mlx backend reads MLX-quantized safetensors of Llama-core models only; "
            f"for {source.config.arch!r} use its float checkpoint or a GGUF file"
        )


def read_tensors(files: list[Path], fmt: str) -> dict[str, mx.array]:
    """All tensors of a GGUF file or of safetensors shards, renamed to our parameter paths.
    GGUF's ``rope_freqs`` (Llama 3.1 frequency factors) is kept under the key ``"rope_freqs"``."""
    if not files:
        raise ModelFormatError("no weight files found for the model")
    out: dict[str, mx.array] = {}
    for f in files:
        try:
            raw = mx.load(str(f))
        except (RuntimeError, ValueError) as e:
            raise UnsupportedModelError(f"{f}: mlx cannot read this file ({e}); use the torch backend for it") from e
        for name, arr in raw.items():
            new = "rope_freqs" if name == "rope_freqs.weight" else rename(name, fmt)
            if new is None:
                log.debug("%s: ignoring tensor %s", f.name, name)
            else:
                out[new] = arr
    return out


def quantized_modules(tensors: dict[str, mx.array]) -> dict[str, dict]:
    """module path -> {"group_size", "bits"} for every module stored quantized."""
    out = {}
    for key, scales in tensors.items():
        if not key.endswith(".scales"):
            continue
        module = key[: -len(".scales")]
        packed = tensors[f"{module}.weight"]  # [out, in * bits / 32] uint32
        # With the layer's input width known, words and groups per row fix bits and group size
        # (quant_params), for GGUF blocks and MLX-quantized checkpoints alike.
        out[module] = {"words": packed.shape[-1], "groups": scales.shape[-1]}
    return out


def quant_params(words: int, groups: int, in_dims: int) -> dict:
    bits, rem = divmod(32 * words, in_dims)
    if rem or bits not in (2, 3, 4, 5, 6, 8) or in_dims % groups:
        raise UnsupportedModelError(
            f"quantized layout not understood: {words} words and {groups} groups for {in_dims} inputs"
        )
    return {"group_size": in_dims // groups, "bits": bits}


def apply_weights(model: nn.Module, tensors: dict[str, mx.array], dtype) -> None:
    """Swap in quantized layers where the checkpoint is quantized, then assign every tensor."""
    layout = quantized_modules(tensors)
    in_dims = _input_dims(model)
    params = {m: quant_params(v["words"], v["groups"], in_dims[m]) for m, v in layout.items() if m in in_dims}
    nn.quantize(model, class_predicate=lambda path, _m: params.get(path, False))
    expected = {k for k, _ in tree_flatten(model.parameters())}
    missing = sorted(expected - tensors.keys())
    if missing:
        raise ModelFormatError(
            f"checkpoint lacks {len(missing)} tensors the model needs, e.g. {', '.join(missing[:3])}"
        )
    extra = sorted(tensors.keys() - expected)
    if extra:
        log.warning("ignoring %d unexpected tensors, e.g. %s", len(extra), extra[:3])
    cast = [(k, _cast(k, v, dtype)) for k, v in tensors.items() if k in expected]
    model.update(tree_unflatten(cast))
    model.eval()


def _cast(key: str, arr: mx.array, dtype) -> mx.array:
    # Packed quantized words are integers; scales/biases follow the compute dtype so that
    # quantized_matmul sees one floating type.
    return arr if not mx.issubdtype(arr.dtype, mx.floating) else arr.astype(dtype)


def _input_dims(model: nn.Module) -> dict[str, int]:
    """module path -> input width, for every Linear and Embedding (an Embedding's 'input' is
    its row width, the dimension its quantization groups run along)."""
    out = {}
    for path, m in model.named_modules():
        if isinstance(m, nn.Linear):
            out[path] = m.weight.shape[1]
        elif isinstance(m, nn.Embedding):
            out[path] = m.weight.shape[1]
    return out


def weights_nbytes(model: nn.Module) -> int:
    return sum(v.nbytes for _, v in tree_flatten(model.parameters()))
