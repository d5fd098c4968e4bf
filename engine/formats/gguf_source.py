"""GGUF files through the ggml project's own ``gguf`` package: metadata, tensor table, dequantization."""
from __future__ import annotations

import logging
import re
from collections import Counter
from pathlib import Path
from typing import Iterator

import numpy as np

from engine.errors import ModelFormatError, UnsupportedModelError
from engine.formats.gguf_header import TensorEntry, read_gguf_header
from engine.models.config import ModelConfig, RopeScaling

log = logging.getLogger(__name__)

# Types we dequantize (the list; the gguf package implements them in numpy).
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K")

# GGUF tensor name → engine parameter name. One table per format (STYLE.md habit 2).
_NAME_MAP = {
    "token_embd.weight": "embed.weight",
    "output_norm.weight": "norm.weight",
    "output.weight": "lm_head.weight",
    "rope_freqs.weight": "rope_freqs",
}
_BLOCK_MAP = {
    "attn_norm": "attn_norm", "ffn_norm": "mlp_norm",
    "attn_q": "attn.q_proj", "attn_k": "attn.k_proj", "attn_v": "attn.v_proj", "attn_output": "attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_BLOCK_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)$")


def engine_name(gguf_name: str) -> str | None:
    if gguf_name in _NAME_MAP:
        return _NAME_MAP[gguf_name]
    m = _BLOCK_RE.match(gguf_name)
    if m and m.group(2) in _BLOCK_MAP:
        return f"layers.{m.group(1)}.{_BLOCK_MAP[m.group(2)]}.{m.group(3)}"
    return None


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's convert-time permutation of Q/K rows (interleaved → rotate-half RoPE)."""
    # llama.cpp wrote reshape(H, 2, R/H/2).swapaxes(1, 2); this is its inverse
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def permute_qk_rows(n_rows: int, n_heads: int) -> np.ndarray:
    """Row order that turns GGUF Q/K rows into rotate-half order (for raw quantized blocks)."""
    return unpermute_qk(np.arange(n_rows), n_heads)


class GGUFSource:
    format = "gguf"

    def __init__(self, path: Path):
        import gguf

        self.path = path
        self._known = {int(t): size for t, size in gguf.GGML_QUANT_SIZES.items()}
        self.header = read_gguf_header(path, self._known)
        self.file_size_bytes = self.header.file_size
        self.meta = self.header.meta
        self.tensors: dict[str, TensorEntry] = {t.name: t for t in self.header.tensors}
        self._data = np.memmap(path, dtype=np.uint8, mode="r")
        self.arch = str(self.meta.get("general.architecture", "?"))
        self.config = self._config()
        self._check_types()

    # -- metadata -------------------------------------------------------------------------------
    def _get(self, key: str, default=None, required: bool = False):
        full = f"{self.arch}.{key}"
        if full not in self.meta:
            if required:
                raise ModelFormatError(f"{self.path}: metadata field {full} is missing")
            return default
        return self.meta[full]

    def _config(self) -> ModelConfig:
        if self.arch not in ("llama", "mistral", "qwen2"):
            raise UnsupportedModelError(
                f"{self.path}: architecture {self.arch!r} is not supported (llama, mistral, qwen2 are)")
        n_heads = int(self._get("attention.head_count", required=True))
        dim = int(self._get("embedding_length", required=True))
        vocab = int(self._get("vocab_size", 0)) or self._array_len("tokenizer.ggml.tokens")
        return ModelConfig(
            arch=self.arch, dim=dim, n_layers=int(self._get("block_count", required=True)),
            n_heads=n_heads, n_kv_heads=int(self._get("attention.head_count_kv", n_heads)),
            hidden_dim=int(self._get("feed_forward_length", required=True)), vocab_size=vocab,
            head_dim=int(self._get("attention.key_length", 0) or 0),
            norm_eps=float(self._get("attention.layer_norm_rms_epsilon", 1e-5)),
            rope_theta=float(self._get("rope.freq_base", 10000.0)),
            rope_scaling=self._rope_scaling(),
            max_seq_len=int(self._get("context_length", 2048)),
            tie_embeddings="output.weight" not in self.tensors,
            qkv_bias="blk.0.attn_q.bias" in self.tensors,
        )

    def _rope_scaling(self) -> RopeScaling | None:
        kind = self._get("rope.scaling.type")
        if kind in (None, "none"):
            return None
        if kind != "linear":
            raise UnsupportedModelError(f"{self.path}: rope scaling type {kind!r} is not supported (linear is)")
        return RopeScaling("linear", factor=float(self._get("rope.scaling.factor", 1.0)))

    def _array_len(self, key: str) -> int:
        return len(self.meta.get(key) or ())

    def type_name(self, t: TensorEntry) -> str:
        import gguf

        return gguf.GGMLQuantizationType(t.ggml_type).name

    def _check_types(self) -> None:
        bad = sorted({self.type_name(t) for t in self.tensors.values()} - set(SUPPORTED_TYPES))
        if bad:
            raise UnsupportedModelError(
                f"{self.path}: quantization type(s) {', '.join(bad)} not supported "
                f"(supported: {', '.join(SUPPORTED_TYPES)}); re-quantize to one of those")

    @property
    def quant_summary(self) -> dict[str, int]:
        return dict(Counter(self.type_name(t) for t in self.tensors.values()))

    @property
    def chat_template(self) -> str | None:
        return self.meta.get("tokenizer.chat_template")

    # -- tensors --------------------------------------------------------------------------------
    def raw_tensor(self, name: str) -> tuple[str, np.ndarray, tuple[int, ...]]:
        """(ggml type name, raw blocks as stored, logical numpy shape) for an engine parameter name,
        with Q/K rows already in rotate-half order."""
        gname = self._gguf_name(name)
        t = self.tensors[gname]
        shape = tuple(int(d) for d in reversed(t.shape))
        data = self._raw(t)
        if gname.endswith(("attn_q.weight", "attn_k.weight")) and self.arch == "llama":
            heads = self.config.n_heads if "attn_q" in gname else self.config.n_kv_heads
            data = data[permute_qk_rows(shape[0], heads)]
        return self.type_name(t), data, shape

    def _raw(self, t: TensorEntry) -> np.ndarray:
        """Raw blocks, one row per output row: [rows, bytes_per_row] (a view of the mapped file)."""
        from engine.formats.gguf_header import tensor_nbytes

        start = self.header.data_start + t.offset
        flat = self._data[start:start + tensor_nbytes(t, self._known)]
        return flat.reshape(-1, tensor_nbytes(TensorEntry(t.name, t.shape[:1], t.ggml_type, 0), self._known))

    def _gguf_name(self, name: str) -> str:
        for g in self.tensors:
            if engine_name(g) == name:
                return g
        raise KeyError(name)

    def tensor_names(self) -> list[str]:
        return [n for n in (engine_name(g) for g in self.tensors) if n is not None]

    def iter_tensors(self) -> Iterator[tuple[str, np.ndarray]]:
        """(engine name, float32 ndarray in numpy/torch layout [out, in]) for every tensor."""
        import gguf

        for t in self.tensors.values():
            name = engine_name(t.name)
            if name is None:
                log.warning("%s: ignoring unknown tensor %s", self.path, t.name)
                continue
            shape = tuple(int(d) for d in reversed(t.shape))
            w = gguf.quants.dequantize(self._raw(t), gguf.GGMLQuantizationType(t.ggml_type)).reshape(shape)
            if w.dtype != np.float32 or not w.flags.writeable:
                w = w.astype(np.float32)  # F32 tensors arrive as read-only views of the mapped file
            if self.arch == "llama" and t.name.endswith(("attn_q.weight", "attn_k.weight")):
                heads = self.config.n_heads if "attn_q" in t.name else self.config.n_kv_heads
                w = unpermute_qk(w, heads)
            elif self.arch == "llama" and t.name.endswith(("attn_q.bias", "attn_k.bias")):
                heads = self.config.n_heads if "attn_q" in t.name else self.config.n_kv_heads
                w = unpermute_qk(w, heads)
            yield name, w

