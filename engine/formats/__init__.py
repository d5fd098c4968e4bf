"""Model sources: a GGUF file or a Hugging Face directory → config, tensors, tokenizer, template.

source = open_model(path)   # validates before allocating
source.config, source.tokenizer, source.iter_tensors(), source.quant_summary
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from opscope.engine.core.errors import BadMagic, ModelFormatError
from opscope.engine.formats.files import PICKLE_SUFFIXES

if TYPE_CHECKING:
    from opscope.engine.formats.gguf_source import GGUFSource
    from opscope.engine.formats.hf_source import HFDirSource

__all__ = ["open_model", "check_model_path", "ModelSource"]


class ModelSource:
    """What every source offers (GGUFSource, HFDirSource): path, format, config, meta,
    file_size_bytes, quant_summary, chat_template, iter_tensors(), tokenizer."""


def open_model(path: str | Path | None = None) -> GGUFSource | HFDirSource:
    """The source of ``path`` (None: the embedded default model): a .gguf file, one .safetensors
    file (config.json and tokenizer files beside it), or a Hugging Face directory. A file path loads
    exactly that file or fails; nothing else in its directory is tried in its place."""
    from opscope.engine.core.defaults import default_model_path
    from opscope.engine.formats.files import is_pickle, refuse_pickle

    p = Path(path).expanduser() if path is not None else default_model_path()
    check_model_path(p)
    if p.is_dir():
        return _hf(p)
    with open(p, "rb") as f:
        head = f.read(8)
    if head[:4] == b"GGUF":
        return _gguf(p)
    if p.suffix == ".safetensors":
        return _hf(p.parent, only=p)
    if is_pickle(head) or p.suffix in PICKLE_SUFFIXES:
        raise refuse_pickle(p)
    raise BadMagic(p, f"not a GGUF file (magic {head[:4]!r} at byte 0, expected b'GGUF') nor a .safetensors file")


def check_model_path(path: str | Path) -> Path:
    """``path`` expanded, if it can be a model: it exists and is a regular, non-empty file or a
    directory holding one (config.json, *.safetensors or *.gguf). Only stat and a directory listing:
    a command checks this before it creates anything (a run store) for a model it cannot open."""
    from opscope.engine.formats.files import check_regular_file

    p = Path(path).expanduser()
    if not p.exists():
        raise ModelFormatError(f"{p}: no such file or directory; give a .gguf file or a Hugging Face model directory")
    if p.is_dir():
        _check_holds_model(p)
    else:
        check_regular_file(p)
    return p


def _check_holds_model(p: Path) -> None:
    from opscope.engine.formats.files import refuse_pickle

    if (p / "config.json").is_file() or any(p.glob("*.gguf")) or any(p.glob("*.safetensors")):
        return
    pickles = sorted(f for f in p.iterdir() if f.suffix in PICKLE_SUFFIXES)
    if pickles:
        raise refuse_pickle(pickles[0])
    raise ModelFormatError(f"{p}: directory holds no model (no config.json, *.safetensors or *.gguf)")


def _gguf(p: Path) -> GGUFSource:
    from opscope.engine.core.errors import WrongMetadataType
    from opscope.engine.formats.gguf_source import GGUFSource
    from opscope.engine.formats.tokenizer_checks import check_gguf_merges
    from opscope.engine.tokenizer.loader import from_gguf

    src = GGUFSource(p)
    try:
        src.tokenizer = from_gguf(src.meta, p)
    except WrongMetadataType:
        check_gguf_merges(p, src.meta)  # names the merge at fault, if one is
        raise
    return src


def _hf(p: Path, only: Path | None = None) -> GGUFSource | HFDirSource:
    from opscope.engine.formats.hf_source import HFDirSource
    from opscope.engine.tokenizer.loader import from_hf_dir

    if only is None and not (p / "config.json").is_file():
        ggufs = sorted(p.glob("*.gguf"))
        if ggufs:
            return _gguf(ggufs[0])
        _check_holds_model(p)
    from opscope.engine.formats.files import MAX_TOKENIZER_JSON_BYTES, check_json_size, read_json_object
    from opscope.engine.formats.tokenizer_checks import check_hf_tokenizer, check_token_ids_fit

    src = HFDirSource(p, only=only)
    if (p / "tokenizer.json").exists():
        check_json_size(p / "tokenizer.json", MAX_TOKENIZER_JSON_BYTES)  # a regular file the parser can hold
    if (p / "tokenizer_config.json").exists():
        read_json_object(p / "tokenizer_config.json")  # a regular file, bounded, a JSON object, keys unique
    src.tokenizer = from_hf_dir(p)
    check_hf_tokenizer(p / "tokenizer.json", src.tokenizer.backend)
    check_token_ids_fit(p, src.tokenizer, src.config.vocab_size)
    return src
