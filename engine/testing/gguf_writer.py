"""Write a GGUF the way llama.cpp's ``convert_hf_to_gguf.py`` would: real metadata keys and tensor
names per architecture, from a Hugging Face style config and Hugging Face named tensors.

    from opscope.engine.testing.gguf_writer import hf_config, write_gguf
    cfg = hf_config("llama", hidden_size=2048, num_hidden_layers=16, intermediate_size=8192,
                    num_attention_heads=32, num_key_value_heads=8, vocab_size=32000)
    write_gguf("/tmp/llama-1b.gguf", cfg, types="F16")        # random weights, streamed

Used by the per-architecture contract tests (tests/engine/models/test_families.py) and synthetic benchmarks. It
is a test reference, so it follows the converter and the ``gguf`` package, never OpScope's own
loaders: names come from ``gguf.get_tensor_name_map``, Q/K rows are permuted for llama-arch files
(interleaved RoPE), Gemma norm weights are stored with the +1 already added, and types are
quantized with ``gguf.quants.quantize``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np

log = logging.getLogger(__name__)

FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3")

# HF model_type → GGUF general.architecture (llama.cpp writes Mistral as llama)
_GGUF_ARCH = {
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma2": "gemma2",
    "gemma3": "gemma3",
    "gemma3_text": "gemma3",
    "phi3": "phi3",
}

_TINY = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    vocab_size=320,
    max_position_embeddings=512,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    tie_word_embeddings=False,
)
_FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {},
    "mistral": {"sliding_window": 16},
    "qwen2": {"tie_word_embeddings": True},
    "qwen3": {"head_dim": 32},
    "gemma2": {
        "head_dim": 32,
        "sliding_window": 16,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
        "query_pre_attn_scalar": 32,
        "tie_word_embeddings": True,
        "hidden_activation": "gelu_pytorch_tanh",
    },
    "gemma3": {
        "head_dim": 32,
        "sliding_window": 16,
        "rope_theta": 1_000_000.0,
        "rope_local_base_freq": 10000.0,
        "query_pre_attn_scalar": 32,
        "tie_word_embeddings": True,
        "sliding_window_pattern": 6,
        "hidden_activation": "gelu_pytorch_tanh",
    },
    "phi3": {},
}

TensorLike: TypeAlias = "np.ndarray | RawBlocks | Callable[[], np.ndarray | RawBlocks]"

# Byte offsets of the float16 scale fields in one block of the types gguf-py cannot quantize (ggml's
# block structs): random blocks get these set so that their values have a chosen spread.
_SCALE_FIELDS = {
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
    "IQ4_NL": (0,),
    "IQ4_XS": (0,),
}


@dataclass(frozen=True)
class RawBlocks:
    """A tensor given as already-encoded GGML blocks (bytes [rows, bytes per row]), written as is."""

    qtype: str
    data: np.ndarray


def random_blocks(qtype: str, shape: tuple[int, ...], seed: int = 0, std: float = 0.02) -> RawBlocks:
    """Valid random blocks of ``qtype`` for a tensor of ``shape`` ([rows, cols]) whose dequantized
    values have about ``std`` spread: the K-quants and IQ4 types, which gguf-py can read but not write
    (no llama-quantize needed). Quantized bits are random; the float16 scales are set."""
    import gguf

    t = gguf.GGMLQuantizationType[qtype]
    block, nbytes = gguf.GGML_QUANT_SIZES[t]
    raw = np.random.default_rng(seed).integers(0, 256, (shape[0], shape[1] // block, nbytes), dtype=np.uint8)

    def set_scales(value: float) -> None:
        for at in _SCALE_FIELDS[qtype]:
            raw[..., at : at + 2] = np.full(raw.shape[:2], value, np.float16).view(np.uint8).reshape(*raw.shape[:2], 2)

    set_scales(1.0)
    spread = float(gguf.quants.dequantize(raw.reshape(shape[0], -1), t).std())
    set_scales(std / spread)
    return RawBlocks(qtype, raw.reshape(shape[0], -1))


def hf_config(family: str, **overrides) -> dict:
    """A tiny config.json-style dict for ``family`` (model_type set), updated with ``overrides``."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r} (known: {', '.join(FAMILIES)})")
    cfg = {"model_type": "gemma3_text" if family == "gemma3" else family, **_TINY, **_FAMILY_DEFAULTS[family]}
    cfg.update(overrides)
    return cfg


def tensor_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """HF parameter name → shape [out, in] for every tensor a model of ``cfg`` holds."""
    family = _family(cfg)
    C, F, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    H, K = cfg["num_attention_heads"], cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    D = cfg.get("head_dim") or C // H
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (V, C)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (C,)
        if family == "phi3":
            shapes[p + "self_attn.qkv_proj.weight"] = ((H + 2 * K) * D, C)
            shapes[p + "mlp.gate_up_proj.weight"] = (2 * F, C)
        else:
            for n, rows in (("q", H * D), ("k", K * D), ("v", K * D)):
                shapes[p + f"self_attn.{n}_proj.weight"] = (rows, C)
                if family == "qwen2":
                    shapes[p + f"self_attn.{n}_proj.bias"] = (rows,)
            shapes[p + "mlp.gate_proj.weight"] = (F, C)
            shapes[p + "mlp.up_proj.weight"] = (F, C)
        shapes[p + "self_attn.o_proj.weight"] = (C, H * D)
        shapes[p + "mlp.down_proj.weight"] = (C, F)
        shapes[p + "post_attention_layernorm.weight"] = (C,)
        if family in ("qwen3", "gemma3"):
            shapes[p + "self_attn.q_norm.weight"] = (D,)
            shapes[p + "self_attn.k_norm.weight"] = (D,)
        if family in ("gemma2", "gemma3"):
            shapes[p + "pre_feedforward_layernorm.weight"] = (C,)
            shapes[p + "post_feedforward_layernorm.weight"] = (C,)
    shapes["model.norm.weight"] = (C,)
    if not cfg.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = (V, C)
    return shapes


def random_tensors(cfg: dict, seed: int = 0, std: float = 0.02) -> dict[str, Callable[[], np.ndarray]]:
    """Lazy random weights for ``cfg``: name → a function that makes the tensor when called, so a
    writer holds one tensor at a time. Matrices ~ N(0, std); norm weights near their identity
    (1 for Llama-style norms, 0 for Gemma's 1+w norms); biases small."""
    gemma = _family(cfg) in ("gemma2", "gemma3")

    def make(name: str, shape: tuple[int, ...], k: int) -> Callable[[], np.ndarray]:
        def fn() -> np.ndarray:
            rng = np.random.default_rng([seed, k])
            if len(shape) > 1:
                return rng.standard_normal(shape, dtype=np.float32) * np.float32(std)
            base = 0.0 if gemma or name.endswith(".bias") else 1.0
            return (base + 0.1 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)

        return fn

    return {name: make(name, shape, k) for k, (name, shape) in enumerate(tensor_shapes(cfg).items())}


def write_gguf(
    path: str | Path,
    cfg: dict,
    tensors: Mapping[str, TensorLike] | None = None,
    *,
    types: str | Mapping[str, str] | Callable[[str], str] = "F16",
    seed: int = 0,
    name: str | None = None,
    tokenizer: bool = True,
) -> Path:
    """Write ``cfg`` + ``tensors`` as a GGUF file at ``path`` and return the path.

    ``cfg``: a Hugging Face config.json-style dict with ``model_type`` (see ``hf_config``).
    ``tensors``: HF parameter name → float32 array in the HF layout, or a zero-argument function
    returning one (evaluated once, while writing, so a large model is never held whole); None →
    ``random_tensors(cfg, seed)``. ``types``: the GGML type of 2-D tensors ("F32", "F16", "BF16",
    "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"), one for all, a dict by HF name (missing → F16) or a
    function of the HF name; 1-D tensors (norms, biases) are always F32, as llama.cpp writes them.
    ``tokenizer``: add a small byte-level BPE tokenizer ("gpt2") sized to ``vocab_size``.
    Tensors are streamed: two passes over the names, each tensor materialized once.
    """
    import gguf

    family, arch = _family(cfg), _GGUF_ARCH[cfg["model_type"]]
    tensors = random_tensors(cfg, seed) if tensors is None else tensors
    shapes = tensor_shapes(cfg)
    missing = sorted(set(shapes) - set(tensors))
    if missing:
        raise ValueError(f"tensors missing for a {family} model: {missing[:4]}")
    arch_id = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[arch]
    name_map = gguf.get_tensor_name_map(arch_id, cfg["num_hidden_layers"])  # HF → GGUF, as the converter
    plan = [(hf, _gguf_name(name_map, hf), shapes[hf], _type_of(types, hf, shapes[hf])) for hf in shapes]
    path = Path(path)
    w = gguf.GGUFWriter(str(path), arch)
    # general.name: transformers reads a llama-arch file named exactly "mistral" as Mistral, which
    # its gguf-py mapping then cannot load; a descriptive name avoids that
    _write_meta(w, cfg, family, arch, name or f"{family}-test")
    if tokenizer:
        _write_tokenizer(w, cfg["vocab_size"])
    for _hf, gname, shape, qtype in plan:
        w.add_tensor_info(gname, _byte_shape(shape, qtype), _np_dtype(qtype), _nbytes(shape, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for hf, _gname, shape, qtype in plan:
        t = tensors[hf]
        value = t() if callable(t) else t
        if isinstance(value, RawBlocks):  # pre-encoded: its type must be the one planned
            if value.qtype != qtype.name or value.data.nbytes != _nbytes(shape, qtype):
                raise ValueError(
                    f"tensor {hf}: {value.qtype} blocks of {value.data.nbytes} bytes for a "
                    f"{qtype.name} tensor of shape {shape}"
                )
            w.write_tensor_data(value.data)
            continue
        arr = np.asarray(value, dtype=np.float32)
        if tuple(arr.shape) != tuple(shape):
            raise ValueError(f"tensor {hf} has shape {arr.shape}, the config implies {shape}")
        w.write_tensor_data(_encode(_convert(arr, hf, cfg, family, arch), qtype))
        del arr
    w.close()
    log.info("wrote %s (%s, %d tensors)", path, arch, len(plan))
    return path


# -- conversion as llama.cpp's converter does it ---------------------------------------------------
def _convert(w: np.ndarray, hf: str, cfg: dict, family: str, arch: str) -> np.ndarray:
    if arch == "llama" and hf.endswith(("q_proj.weight", "k_proj.weight")):
        H = cfg["num_attention_heads"]
        heads = H if "q_proj" in hf else (cfg.get("num_key_value_heads") or H)
        return _permute(w, heads)
    if family in ("gemma2", "gemma3") and hf.endswith("norm.weight"):
        return w + 1.0  # Gemma computes x·(1+w); GGUF stores 1+w
    return w


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    # convert_hf_to_gguf.py LlamaModel.permute: rotate-half → interleaved pairs
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _gguf_name(name_map, hf: str) -> str:
    base, _, suffix = hf.rpartition(".")
    g = name_map.get_name(base)
    if g is None:
        raise ValueError(f"no GGUF name for tensor {hf}")
    return f"{g}.{suffix}"


def _type_of(types: Any, hf: str, shape: tuple[int, ...]) -> Any:  # a gguf.GGMLQuantizationType
    import gguf

    if len(shape) == 1:
        name = "F32"
    elif isinstance(types, str):
        name = types
    elif callable(types):
        name = types(hf)
    else:
        name = types.get(hf, "F16")
    qtype = gguf.GGMLQuantizationType[name]
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    if shape[-1] % block:
        raise ValueError(f"tensor {hf}: rows of {shape[-1]} are not a multiple of {name}'s block of {block}")
    return qtype


def _np_dtype(qtype):
    import gguf

    return {
        gguf.GGMLQuantizationType.F32: np.dtype(np.float32),
        gguf.GGMLQuantizationType.F16: np.dtype(np.float16),
    }.get(qtype, np.dtype(np.uint8))


def _byte_shape(shape, qtype):
    import gguf

    if qtype in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
        return shape
    return gguf.quant_shape_to_byte_shape(shape, qtype)


def _nbytes(shape, qtype) -> int:
    return int(np.prod(_byte_shape(shape, qtype))) * _np_dtype(qtype).itemsize


def _encode(w: np.ndarray, qtype) -> np.ndarray:
    import gguf

    if qtype == gguf.GGMLQuantizationType.F32:
        return np.ascontiguousarray(w, dtype=np.float32)
    if qtype == gguf.GGMLQuantizationType.F16:
        return np.ascontiguousarray(w, dtype=np.float16)
    return gguf.quants.quantize(np.ascontiguousarray(w, dtype=np.float32), qtype)


# -- metadata ------------------------------------------------------------------------------------------
def _write_meta(w, cfg: dict, family: str, arch: str, name: str) -> None:
    import gguf

    H = cfg["num_attention_heads"]
    K = cfg.get("num_key_value_heads") or H
    D = cfg.get("head_dim") or cfg["hidden_size"] // H
    w.add_name(name)
    w.add_context_length(cfg.get("max_position_embeddings", 2048))
    w.add_embedding_length(cfg["hidden_size"])
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(H)
    w.add_head_count_kv(K)
    w.add_layer_norm_rms_eps(cfg.get("rms_norm_eps", 1e-6))
    w.add_rope_freq_base(cfg.get("rope_theta", 10000.0))
    w.add_vocab_size(cfg["vocab_size"])
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    if family in ("llama", "mistral", "phi3"):
        w.add_rope_dimension_count(D)
    if cfg.get("head_dim") or family in ("gemma2", "gemma3"):
        w.add_key_length(D)
        w.add_value_length(D)
    if cfg.get("sliding_window") and family in ("mistral", "gemma2", "gemma3"):
        w.add_sliding_window(cfg["sliding_window"])
    if family == "gemma2":
        w.add_attn_logit_softcapping(cfg.get("attn_logit_softcapping", 50.0))
        w.add_final_logit_softcapping(cfg.get("final_logit_softcapping", 30.0))
    rs = cfg.get("rope_scaling")
    if rs and (rs.get("rope_type") or rs.get("type")) == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rs["factor"])


def _byte_unicode() -> dict[int, str]:
    # GPT-2's bytes_to_unicode: printable stand-ins for every byte
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def byte_level_vocab(vocab_size: int) -> tuple[list[str], list[str], list[int]]:
    """(tokens, merges, token types) of a small byte-level BPE: <|endoftext|> (control, id 0), the 256
    byte tokens, merges of frequent English letter pairs, then padding tokens up to ``vocab_size``."""
    import gguf

    b2u = _byte_unicode()
    tokens = ["<|endoftext|>"] + [b2u[b] for b in range(256)]
    types = [gguf.TokenType.CONTROL] + [gguf.TokenType.NORMAL] * 256
    merges: list[str] = []
    letters = "etaoinshrdlucmfwyp"
    pairs = [(b2u[ord(" ")], c) for c in letters] + [(a, b) for a in letters for b in letters]
    for a, b in pairs:
        if len(tokens) >= vocab_size:
            break
        merges.append(f"{a} {b}")
        tokens.append(a + b)
        types.append(gguf.TokenType.NORMAL)
    while len(tokens) < vocab_size:
        tokens.append(f"<unused{len(tokens)}>")
        types.append(gguf.TokenType.USER_DEFINED)
    if len(tokens) > vocab_size:
        raise ValueError(f"vocab_size {vocab_size} is below the 257 tokens a byte-level vocabulary needs")
    return tokens, merges, [int(t) for t in types]


def _write_tokenizer(w, vocab_size: int) -> None:
    tokens, merges, types = byte_level_vocab(vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)
    w.add_pad_token_id(0)  # transformers' Phi-3 defaults to pad id 32000, outside a small vocabulary
    w.add_add_bos_token(False)


def _family(cfg: dict) -> str:
    mt = cfg.get("model_type")
    family = "gemma3" if mt == "gemma3_text" else mt
    if family not in FAMILIES:
        raise ValueError(f"model_type {mt!r} is not one of {', '.join(FAMILIES)}")
    return family


def write_typed_gguf(path: str | Path, cfg: dict, qtype: str, seed: int = 0, std: float = 0.05) -> Path:
    """``cfg`` with every 2-D tensor of ``qtype``: quantized by gguf-py where it can, random valid
    blocks (``random_blocks``) for the K-quants and IQ4 types. Rows must be multiples of the type's
    block (256 for the K-quants)."""
    tensors = random_tensors(cfg, seed, std)
    if qtype in _SCALE_FIELDS:
        shapes = tensor_shapes(cfg)

        def blocks(hf: str, k: int) -> Callable[[], RawBlocks]:
            return lambda: random_blocks(qtype, shapes[hf], seed=k, std=std)

        tensors = {hf: blocks(hf, k) if len(shapes[hf]) == 2 else fn for k, (hf, fn) in enumerate(tensors.items())}
    return write_gguf(path, cfg, tensors, types=qtype)
