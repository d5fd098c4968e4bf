"""Model sources: a GGUF file or a Hugging Face directory → config, tensors, tokenizer, template.

    source = open_model(path)   # validates before allocating
    source.config, source.tokenizer, source.iter_tensors(), source.quant_summary
"""
from __future__ import annotations

from pathlib import Path

from engine.errors import ModelFormatError

__all__ = ["open_model", "ModelSource"]


class ModelSource:
    """What every source offers (GGUFSource, HFDirSource): path, format, config, meta,
    file_size_bytes, quant_summary, chat_template, iter_tensors(), tokenizer."""


def open_model(path: str | Path | None = None):
    from engine.defaults import default_model_path

    p = Path(path).expanduser() if path is not None else default_model_path()
    if not p.exists():
        raise ModelFormatError(f"{p}: no such file or directory; give a .gguf file or a Hugging Face model directory")
    if p.is_dir():
        return _hf(p)
    if p.stat().st_size == 0:
        raise ModelFormatError(f"{p}: file is empty (0 bytes)")
    with open(p, "rb") as f:
        magic = f.read(4)
    if magic == b"GGUF":
        return _gguf(p)
    if p.suffix == ".safetensors":
        return _hf(p.parent)
    raise ModelFormatError(f"{p}: not a GGUF file (magic {magic!r}) nor a Hugging Face model directory")


def _gguf(p: Path):
    from engine.formats.gguf_source import GGUFSource
    from engine.tokenizer import from_gguf

    src = GGUFSource(p)
    src.tokenizer = from_gguf(src.meta, p)
    return src


def _hf(p: Path):
    from engine.formats.hf_source import HFDirSource
    from engine.tokenizer import from_hf_dir

    if not (p / "config.json").is_file() and not list(p.glob("*.safetensors")) and not list(p.glob("*.gguf")):
        raise ModelFormatError(f"{p}: directory holds no model (no config.json, *.safetensors or *.gguf)")
    ggufs = sorted(p.glob("*.gguf"))
    if not (p / "config.json").is_file() and ggufs:
        return _gguf(ggufs[0])
    src = HFDirSource(p)
    src.tokenizer = from_hf_dir(p)
    return src
