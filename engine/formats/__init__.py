"""Model sources: a GGUF file or a Hugging Face directory → config, tensors, tokenizer, template.

    source = open_model(path)   # validates before allocating
    source.config, source.tokenizer, source.iter_tensors(), source.quant_summary
"""
from __future__ import annotations

from pathlib import Path

from opscope.engine.errors import BadMagic, ModelFormatError
from opscope.engine.formats.files import PICKLE_SUFFIXES

__all__ = ["open_model", "ModelSource"]


class ModelSource:
    """What every source offers (GGUFSource, HFDirSource): path, format, config, meta,
    file_size_bytes, quant_summary, chat_template, iter_tensors(), tokenizer."""


def open_model(path: str | Path | None = None):
    """The source of ``path`` (None: the embedded default model): a .gguf file, one .safetensors
    file (config.json and tokenizer files beside it), or a Hugging Face directory. A file path loads
    exactly that file or fails; nothing else in its directory is tried in its place."""
    from opscope.engine.defaults import default_model_path
    from opscope.engine.formats.files import check_regular_file, is_pickle, refuse_pickle

    p = Path(path).expanduser() if path is not None else default_model_path()
    if not p.exists():
        raise ModelFormatError(f"{p}: no such file or directory; give a .gguf file or a Hugging Face model directory")
    if p.is_dir():
        return _hf(p)
    check_regular_file(p)
    with open(p, "rb") as f:
        head = f.read(8)
    if head[:4] == b"GGUF":
        return _gguf(p)
    if p.suffix == ".safetensors":
        return _hf(p.parent, only=p)
    if is_pickle(head) or p.suffix in PICKLE_SUFFIXES:
        raise refuse_pickle(p)
    raise BadMagic(p, f"not a GGUF file (magic {head[:4]!r} at byte 0, expected b'GGUF') nor a .safetensors file")


def _gguf(p: Path):
    from opscope.engine.formats.gguf_source import GGUFSource
    from opscope.engine.tokenizer import from_gguf

    src = GGUFSource(p)
    src.tokenizer = from_gguf(src.meta, p)
    return src


def _hf(p: Path, only: Path | None = None):
    from opscope.engine.formats.files import refuse_pickle
    from opscope.engine.formats.hf_source import HFDirSource
    from opscope.engine.tokenizer import from_hf_dir

    if only is None and not (p / "config.json").is_file():
        ggufs = sorted(p.glob("*.gguf"))
        if ggufs:
            return _gguf(ggufs[0])
        if not list(p.glob("*.safetensors")):
            pickles = sorted(f for f in p.iterdir() if f.suffix in PICKLE_SUFFIXES)
            if pickles:
                raise refuse_pickle(pickles[0])
            raise ModelFormatError(f"{p}: directory holds no model (no config.json, *.safetensors or *.gguf)")
    src = HFDirSource(p, only=only)
    src.tokenizer = from_hf_dir(p)
    return src
