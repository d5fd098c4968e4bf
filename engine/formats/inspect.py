"""A model source described for people: what `opscope models inspect` prints.

``inspect_path`` reads a GGUF's or a .safetensors file's header itself, so any such file is
described (metadata, tensor types; a safetensors file's tensors with their shapes), including one
the engine cannot run (an unknown architecture, a lone .safetensors without its config.json); then
it says in one line why it cannot, or adds what the engine makes of it (``describe``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opscope.engine.core.errors import EngineError
from opscope.engine.core.units import format_bytes

if TYPE_CHECKING:
    from opscope.engine.formats.gguf_source import GGUFSource
    from opscope.engine.formats.hf_source import HFDirSource
    from opscope.engine.models.config import ModelConfig

_LONG_STRING = 120
_TEXT_TENSORS = 64  # tensors listed by the text view (JSON lists all)


def describe(source: GGUFSource | HFDirSource) -> dict:
    cfg = source.config
    tok = source.tokenizer
    return {
        "path": str(source.path),
        "format": source.format,
        "architecture": cfg.arch,
        "parameters": cfg.n_params,
        "parameters_human": _human(cfg.n_params),
        "layers": cfg.n_layers,
        "dim": cfg.dim,
        "heads": f"{cfg.n_heads} query / {cfg.n_kv_heads} kv, head dim {cfg.head_dim}",
        "ffn_dim": cfg.hidden_dim,
        "vocab_size": cfg.vocab_size,
        "context_length": cfg.max_seq_len,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": cfg.rope_scaling.kind if cfg.rope_scaling else "none",
        "tied_embeddings": cfg.tie_embeddings,
        "block": block_summary(cfg),
        "quantization": source.quant_summary,
        "file_size_bytes": source.file_size_bytes,
        "file_size": format_bytes(source.file_size_bytes),
        "tokenizer": f"{tok.backend.get_vocab_size()} tokens, bos={tok.bos_id}, eos={list(tok.eos_ids)}, "
        f"add_bos={tok.add_bos}",
        "chat_template": "present"
        if tok.chat_template
        else f"absent: {tok.fallback.name} fallback ({tok.fallback.reason})",
    }


def block_summary(cfg: ModelConfig) -> str:
    """The switches a family sets on the shared Llama block, in words ("llama" when none)."""
    parts = []
    if cfg.qkv_bias:
        parts.append("qkv bias")
    if cfg.qk_norm:
        parts.append("QK-norm")
    if cfg.post_norms:
        parts.append("post-norms")
    if cfg.mlp_act != "silu":
        parts.append(f"MLP {cfg.mlp_act}")
    if cfg.embed_scale != 1.0:
        parts.append(f"embed ×{cfg.embed_scale:.4g}")
    if cfg.attn_scale:
        parts.append(f"query scale {cfg.attn_scale:.4g}")
    if cfg.attn_softcap or cfg.final_softcap:
        parts.append(f"softcap attn {cfg.attn_softcap:g} / logits {cfg.final_softcap:g}")
    local = [cfg.window(i) for i in range(cfg.n_layers) if cfg.window(i)]
    if local:
        parts.append(f"sliding window {max(local)} on {len(local)}/{cfg.n_layers} layers")
    if cfg.rope_local_theta:
        parts.append(f"local rope θ {cfg.rope_local_theta:g}")
    return ", ".join(parts) or "llama"


def inspect_path(path: str | Path | None) -> dict:
    """Everything `opscope models inspect` shows for ``path`` (None: the embedded default model).
    ``runnable`` is "yes" or "no: <why>"; a GGUF's own metadata is listed either way."""
    from opscope.engine.core.defaults import default_model_path
    from opscope.engine.formats import open_model

    info: dict = {}
    p = Path(path).expanduser() if path is not None else default_model_path()
    if p.is_file() and _is_gguf(p):
        info = gguf_header_summary(p)
    elif p.is_file() and p.suffix == ".safetensors":
        info = safetensors_header_summary(p)
    try:
        engine_view = describe(open_model(path))
    except EngineError as e:
        if not info:
            raise
        info["runnable"] = f"no: {e}"
        return info
    return {**engine_view, **{k: v for k, v in info.items() if k in ("metadata", "tensor_types")}, "runnable": "yes"}


def gguf_header_summary(path: Path) -> dict:
    """Metadata and tensor table of any GGUF, read without interpreting the architecture: long
    arrays (vocabularies, merges) and long strings (chat templates) shortened."""
    import gguf
    from opscope.engine.formats.gguf_header import read_gguf_header

    known = {int(t): size for t, size in gguf.GGML_QUANT_SIZES.items()}
    header = read_gguf_header(path, known)
    types = Counter(_type_name(t.ggml_type) for t in header.tensors)
    n_params = sum(_numel(t.shape) for t in header.tensors)
    return {
        "path": str(path),
        "format": "gguf",
        "architecture": str(header.meta.get("general.architecture", "?")),
        "tensors": len(header.tensors),
        "parameters": n_params,
        "parameters_human": _human(n_params),
        "file_size_bytes": header.file_size,
        "file_size": format_bytes(header.file_size),
        "tensor_types": dict(types),
        "metadata": {k: _short(v) for k, v in header.meta.items()},
    }


def safetensors_header_summary(path: Path) -> dict:
    """What a .safetensors file holds, from its (checked) header alone: tensors with dtype and shape,
    dtypes, parameters, ``__metadata__``, sizes. Needs no config.json, so a lone file is described."""
    from opscope.engine.formats.safetensors_header import read_safetensors_table

    entries, meta = read_safetensors_table(path)
    n_params = sum(_numel(e.shape) for e in entries)
    return {
        "path": str(path),
        "format": "safetensors",
        "tensors": len(entries),
        "parameters": n_params,
        "parameters_human": _human(n_params),
        "tensor_bytes": sum(e.end - e.begin for e in entries),
        "file_size_bytes": path.stat().st_size,
        "file_size": format_bytes(path.stat().st_size),
        "tensor_types": dict(Counter(e.dtype for e in entries)),
        "metadata": {k: _short(v) for k, v in meta.items()},
        "tensor_table": {e.name: f"{e.dtype} {list(e.shape)}" for e in sorted(entries, key=lambda e: e.begin)},
    }


def format_text(info: dict) -> str:
    """``info`` as aligned ``key  value`` lines; the metadata and the tensor table one entry per line
    below their headings; ``runnable`` last."""
    flat = {k: v for k, v in info.items() if k not in ("metadata", "tensor_table", "runnable")}
    width = max(len(k) for k in flat)
    lines = []
    for k, v in flat.items():
        if isinstance(v, dict):
            v = ", ".join(f"{a} ×{b}" for a, b in v.items())
        lines.append(f"{k:<{width}}  {v}")
    meta = info.get("metadata") or {}
    if meta:
        lines.append("metadata:")
        mw = max(len(k) for k in meta)
        lines += [f"  {k:<{mw}}  {v}" for k, v in meta.items()]
    lines += _tensor_lines(info.get("tensor_table") or {})
    if "runnable" in info:  # last: what the file holds, then whether (and why not) it runs
        lines.append(f"{'runnable':<{width}}  {info['runnable']}")
    return "\n".join(lines)


def _tensor_lines(table: dict) -> list[str]:
    if not table:
        return []
    shown = list(table.items())[:_TEXT_TENSORS]
    width = max(len(k) for k, _ in shown)
    lines = ["tensors:"] + [f"  {k:<{width}}  {v}" for k, v in shown]
    if len(table) > len(shown):
        lines.append(f"  … and {len(table) - len(shown)} more (--json lists all)")
    return lines


def _is_gguf(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


def _type_name(ggml_type: int) -> str:
    import gguf

    try:
        return str(gguf.GGMLQuantizationType(ggml_type).name)
    except ValueError:
        return f"type {ggml_type}"


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _short(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        if len(value) > 8:
            return f"[{len(value)} items: {', '.join(map(repr, value[:3]))}, …]"
        return list(value)
    if isinstance(value, str) and len(value) > _LONG_STRING:
        return f"{value[:_LONG_STRING]!r}… ({len(value)} chars)"
    return value


def _human(n: float, unit: str = "", base: int = 1000) -> str:  # counts (parameters); sizes: format_bytes
    for prefix in ("", "K", "M", "G", "T"):
        if abs(n) < base:
            return f"{n:.1f} {prefix}{unit}".strip()
        n /= base
    return f"{n:.1f} P{unit}"
