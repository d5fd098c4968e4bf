"""GGUF files through the ggml project's own ``gguf`` package: metadata, tensor table, dequantization."""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from opscope.engine.core.errors import MissingMetadata, MissingTensor, UnsupportedModelError
from opscope.engine.formats.gguf_header import TensorEntry, read_gguf_header
from opscope.engine.formats.gguf_tensors import check_tensor_shapes, check_vocabulary
from opscope.engine.models.config import ModelConfig

if TYPE_CHECKING:
    from opscope.engine.models.families import Family
    from opscope.engine.tokenizer.loader import Tokenizer

log = logging.getLogger(__name__)

# Types we read: the dense path dequantizes them with the gguf package (numpy), the CPU fast path
# has a kernel for each (engine/fastpath/kernels). F32 holds norms (and the odd dense weight).
SUPPORTED_TYPES = (
    "F32",
    "F16",
    "BF16",
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "Q8_0",
    "Q2_K",
    "Q3_K",
    "Q4_K",
    "Q5_K",
    "Q6_K",
    "IQ4_NL",
    "IQ4_XS",
)

# GGUF tensor name → engine parameter name. One table per format (STYLE.md habit 2).
_NAME_MAP = {
    "token_embd.weight": "embed.weight",
    "output_norm.weight": "norm.weight",
    "output.weight": "lm_head.weight",
    "rope_freqs.weight": "rope_freqs",
}
_BLOCK_MAP = {
    "attn_norm": "attn_norm",
    "ffn_norm": "mlp_norm",
    "attn_q": "attn.q_proj",
    "attn_k": "attn.k_proj",
    "attn_v": "attn.v_proj",
    "attn_output": "attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_BLOCK_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)$")


def engine_name(gguf_name: str, family: Family | None = None) -> str | None:
    """Engine parameter name of a GGUF tensor (``family``: its extra names), None if unknown."""
    if gguf_name in _NAME_MAP:
        return _NAME_MAP[gguf_name]
    m = _BLOCK_RE.match(gguf_name)
    extra = family.gguf_tensors if family is not None else {}
    sub = extra.get(m.group(2)) or _BLOCK_MAP.get(m.group(2)) if m else None
    return f"layers.{m.group(1)}.{sub}.{m.group(3)}" if m and sub else None


def tensor_index(
    tensors: Iterable[str], family: Family | None, cfg: ModelConfig
) -> dict[str, tuple[str, int, int | None]]:
    """engine name → (GGUF name, first row, rows or None for all): fused tensors (Phi-3's attn_qkv,
    gate|up in ffn_up) become row ranges of their GGUF tensor."""
    index: dict[str, tuple[str, int, int | None]] = {}
    for g in tensors:
        m = _BLOCK_RE.match(g)
        split = family.gguf_fused.get(m.group(2)) if m and family is not None else None
        if m is None or split is None:
            name = engine_name(g, family)
            if name is not None:
                index[name] = (g, 0, None)
            continue
        row = 0
        for sub, rows in split(cfg):
            index[f"layers.{m.group(1)}.{sub}.{m.group(3)}"] = (g, row, rows)
            row += rows
    return index


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
    tokenizer: Tokenizer  # attached by engine.formats.open_model

    def __init__(self, path: Path):
        import gguf

        self.path = path
        self._known = {int(t): size for t, size in gguf.GGML_QUANT_SIZES.items()}
        self.header = read_gguf_header(path, self._known)
        self.file_size_bytes = self.header.file_size
        self.meta = self.header.meta
        self.tensors: dict[str, TensorEntry] = {t.name: t for t in self.header.tensors}
        self._data = np.memmap(path, dtype=np.uint8, mode="r")
        if "general.architecture" not in self.meta:
            raise MissingMetadata(path, "metadata key general.architecture is missing")
        self.arch = self.meta["general.architecture"]
        self.config = self._config()
        if self.tensors:  # a vocabulary-only file (llama.cpp ships such) opens for its tokenizer; loading
            check_tensor_shapes(path, self.tensors, self.family, self.config)  # it stops at MissingTensor
        check_vocabulary(path, self.meta, self.config)
        self._index = tensor_index(self.tensors, self.family, self.config)
        self._check_types()

    # -- metadata -------------------------------------------------------------------------------
    def _config(self) -> ModelConfig:
        from opscope.engine.models.families import GGUFMeta, family_for_gguf

        self.family = family_for_gguf(self.arch, self.path)  # engine.models.families: one module per arch
        return self.family.config_from_gguf(GGUFMeta(self.meta, self.arch, self.path, set(self.tensors)))

    def type_name(self, t: TensorEntry) -> str:
        import gguf

        return str(gguf.GGMLQuantizationType(t.ggml_type).name)

    def _check_types(self) -> None:
        bad = [t for t in self.tensors.values() if self.type_name(t) not in SUPPORTED_TYPES]
        if bad:
            others = f" (and {len(bad) - 1} more tensors)" if len(bad) > 1 else ""
            raise UnsupportedModelError(
                f"{self.path}: tensor {bad[0].name}{others} has quantization type {self.type_name(bad[0])}, "
                f"which is not supported; re-quantize the model to one of {', '.join(SUPPORTED_TYPES)} "
                f"(e.g. llama-quantize --allow-requantize IN.gguf OUT.gguf Q4_K_M)"
            )

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
        gname, row, rows = self._where(name)
        t = self.tensors[gname]
        shape = tuple(int(d) for d in reversed(t.shape))
        data = self._raw(t)
        if rows is not None:  # one part of a fused tensor: whole rows, so quantized blocks split cleanly
            data, shape = data[row : row + rows], (rows, *shape[1:])
        if gname.endswith(("attn_q.weight", "attn_k.weight")) and self.arch == "llama":
            heads = self.config.n_heads if "attn_q" in gname else self.config.n_kv_heads
            data = data[permute_qk_rows(shape[0], heads)]
        return self.type_name(t), data, shape

    def _raw(self, t: TensorEntry) -> np.ndarray:
        """Raw blocks, one row per output row: [rows, bytes_per_row] (a view of the mapped file)."""
        from opscope.engine.formats.gguf_header import tensor_nbytes

        start = self.header.data_start + t.offset
        flat = self._data[start : start + tensor_nbytes(t, self._known)]
        return flat.reshape(-1, tensor_nbytes(TensorEntry(t.name, t.shape[:1], t.ggml_type, 0), self._known))

    def _where(self, name: str) -> tuple[str, int, int | None]:
        if name not in self._index:
            raise MissingTensor(
                self.path,
                f"holds no tensor for the {self.arch} model's {name} (a vocabulary-only file, or tensors left out)",
            )
        return self._index[name]

    def release_pages(self) -> None:
        """Drop the mapped file's pages from this process's resident set (MADV_DONTNEED) once the
        weights live in packed copies: otherwise the file is counted a second time in RSS. The pages
        stay in the page cache; tensors that still view the file fault them back in when read."""
        import mmap

        mm = getattr(self._data, "_mmap", None)  # np.memmap's mapping
        if mm is not None and hasattr(mmap, "MADV_DONTNEED"):
            mm.madvise(mmap.MADV_DONTNEED)

    def tensor_names(self) -> list[str]:
        return list(self._index)

    def iter_tensors(self) -> Iterator[tuple[str, np.ndarray]]:
        """(engine name, float32 ndarray in numpy/torch layout [out, in]) for every tensor."""
        import gguf

        parts: dict[str, list[tuple[str, int, int | None]]] = {}
        for name, (g, row, rows) in self._index.items():
            parts.setdefault(g, []).append((name, row, rows))
        for t in self.tensors.values():
            if t.name not in parts:
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
            for name, row, rows in parts[t.name]:
                yield name, (w if rows is None else w[row : row + rows])  # row slices stay contiguous
