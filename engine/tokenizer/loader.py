"""Tokenizers from GGUF metadata (byte-level BPE vocab + merges, or a SentencePiece vocabulary via
engine/tokenizer/spm.py, → the ``tokenizers`` library) or tokenizer.json, and chat templates
rendered only in jinja2's immutable sandbox (templates come from model files)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from opscope.engine.core.errors import LimitExceeded, MissingMetadata, UnsupportedModelError, WrongMetadataType

if TYPE_CHECKING:
    from opscope.engine.tokenizer.chat_template import ChatTemplate
    from opscope.engine.tokenizer.fallback import FallbackTemplate

log = logging.getLogger(__name__)

# llama.cpp's pre-tokenizer regexes, by tokenizer.ggml.pre (llama-vocab.cpp).
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_SPLITS: dict[str, tuple[str, ...]] = {
    "default": (_GPT2_SPLIT,),
    "gpt2": (_GPT2_SPLIT,),
    "smollm": (r"\p{N}", _GPT2_SPLIT),  # digits one by one, then GPT-2's split
    "llama-bpe": (_LLAMA3_SPLIT,),
    "llama3": (_LLAMA3_SPLIT,),
    "smaug-bpe": (_LLAMA3_SPLIT,),
    "qwen2": (_QWEN2_SPLIT,),
}
CONTROL, USER_DEFINED = 3, 4
_RUNAWAY_FIX = (
    "the tokenizer's regular expression backtracks without bound on this text; use the tokenizer.json "
    "from the model's repository"
)


class Tokenizer:
    """Encode/decode plus the special tokens and chat template the model's metadata declares."""

    def __init__(
        self,
        backend: Any,
        *,
        bos_id: int | None,
        eos_ids: tuple[int, ...],
        add_bos: bool,
        chat_template: str | None,
        pad_id: int | None = None,
        add_eos: bool = False,
        template_source: tuple = (None, "chat_template"),
        fallback: FallbackTemplate | None = None,
    ) -> None:
        from opscope.engine.tokenizer.fallback import CHATML

        self.backend = backend
        self.fallback = fallback or CHATML  # the turn format used when the file ships no template
        self.template_source = template_source  # (file, key) the template came from, for its errors
        self.bos_id, self.eos_ids, self.add_bos, self.add_eos = bos_id, eos_ids, add_bos, add_eos
        self.pad_id = pad_id if pad_id is not None else (eos_ids[0] if eos_ids else 0)
        self.chat_template = chat_template

    @property
    def vocab_size(self) -> int:
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    def token_text(self, token_id: int) -> str:
        return self.backend.id_to_token(token_id) or ""

    source: Path | None = None  # the file the vocabulary and its regular expressions came from, for encode's errors

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        try:
            ids: list[int] = self.backend.encode(text, add_special_tokens=False).ids
        except BaseException as e:  # noqa: B036 - a Rust panic is a BaseException (pyo3's PanicException)
            if type(e).__name__ != "PanicException":
                raise
            raise LimitExceeded(
                self.source, f"the tokenizer gave up on this text: {' '.join(str(e).split())[:160]}", _RUNAWAY_FIX
            ) from None
        if add_special_tokens and self.add_bos and self.bos_id is not None:
            ids = [self.bos_id] + ids
        if add_special_tokens and self.add_eos and self.eos_ids:
            ids = ids + [self.eos_ids[0]]
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return str(self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def stream(self) -> StreamDecoder:
        return StreamDecoder(self)

    # -- chat -----------------------------------------------------------------------------------
    @cached_property
    def _template(self) -> ChatTemplate:
        from opscope.engine.tokenizer.chat_template import ChatTemplate

        if self.chat_template is None:
            return ChatTemplate(self.fallback.text, "built-in", f"{self.fallback.name} fallback")
        return ChatTemplate(self.chat_template, *self.template_source)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        tok = lambda i: self.token_text(i) if i is not None else ""  # noqa: E731
        return self._template.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=tok(self.bos_id),
            eos_token=tok(self.eos_ids[0] if self.eos_ids else None),
        )


class StreamDecoder:
    """Turns token ids into printable text pieces whose concatenation is ``decode(all ids)``.

    Each push decodes the previous piece's ids plus the pending ones and emits what the pending ones
    added: decoding the pending ids alone would lose a SentencePiece token's leading space (its
    decoder strips the first one) and would split a character spread over several byte tokens. While
    the text ends in a replacement char the pending ids are held back (a multi-byte character is
    not complete yet), up to ``max_hold`` ids, after which the bytes really are invalid."""

    max_hold = 8

    def __init__(self, tokenizer: Tokenizer):
        self.tok = tokenizer
        self.context: list[int] = []  # ids of the last emitted piece
        self.context_text = ""
        self.pending: list[int] = []

    def push(self, token_id: int) -> str:
        self.pending.append(token_id)
        text = self.tok.decode(self.context + self.pending)
        if text.endswith("\ufffd") and len(self.pending) < self.max_hold:
            return ""
        return self._emit(text)

    def flush(self) -> str:
        return self._emit(self.tok.decode(self.context + self.pending)) if self.pending else ""

    def _emit(self, text: str) -> str:
        if text.startswith(self.context_text):
            piece = text[len(self.context_text) :]
        else:  # a decoder that rewrites earlier text: fall back to the pending ids alone
            piece = self.tok.decode(self.pending)
        self.context, self.pending = self.pending, []
        self.context_text = self.tok.decode(self.context)
        return piece


# -- builders -------------------------------------------------------------------------------------
SUPPORTED_GGUF_MODELS = ("gpt2", "llama", "gemma")


def from_gguf(meta: dict, path: Path) -> Tokenizer:
    kind = meta.get("tokenizer.ggml.model")
    if kind == "gpt2":
        tokens = _required(meta, "tokenizer.ggml.tokens", path)
        merges = _required(meta, "tokenizer.ggml.merges", path)
        types = [int(t) for t in meta.get("tokenizer.ggml.token_type", ())]
        with _vocabulary_errors(meta, path):
            backend = _byte_level_bpe(tokens, merges, types, str(meta.get("tokenizer.ggml.pre", "default")))
    elif kind in ("llama", "gemma"):
        from opscope.engine.tokenizer.spm import spm_backend

        with _vocabulary_errors(meta, path):
            backend = spm_backend(meta, path)
    else:
        said = "missing" if kind is None else f"{kind!r}"
        raise UnsupportedModelError(
            f"{path}: metadata field tokenizer.ggml.model is {said}; supported tokenizers are "
            f"{', '.join(SUPPORTED_GGUF_MODELS)} (use a GGUF converted with one of those vocabularies)"
        )
    eos = meta.get("tokenizer.ggml.eos_token_id")
    eot = meta.get("tokenizer.ggml.eot_token_id")
    eos_ids = tuple(dict.fromkeys(int(i) for i in (eos, eot) if i is not None))
    bos = meta.get("tokenizer.ggml.bos_token_id")
    # llama.cpp adds BOS to a SentencePiece vocabulary whose file does not say otherwise
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", kind != "gpt2"))
    pad = meta.get("tokenizer.ggml.padding_token_id")  # llama.cpp ignores an id that names no token: so do we
    pad = int(pad) if pad is not None and 0 <= int(pad) < len(meta.get("tokenizer.ggml.tokens") or ()) else None
    if pad is None and meta.get("tokenizer.ggml.padding_token_id") is not None:
        log.warning(
            "%s: tokenizer.ggml.padding_token_id %s names no token; ignored",
            path,
            meta["tokenizer.ggml.padding_token_id"],
        )
    tok = Tokenizer(
        backend,
        bos_id=None if bos is None else int(bos),
        eos_ids=eos_ids,
        add_bos=add_bos,
        add_eos=bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        chat_template=meta.get("tokenizer.chat_template"),
        pad_id=pad,
        template_source=(path, "tokenizer.chat_template"),
        fallback=_fallback(backend, meta.get("general.architecture"), sentencepiece=kind != "gpt2"),
    )
    tok.source = path
    return tok


@contextmanager
def _vocabulary_errors(meta: dict, path: Path) -> Iterator[None]:
    """The tokenizers library's refusals (a merge of unknown tokens, …) as one line naming the key."""
    from opscope.engine.core.errors import ModelLoadError

    try:
        yield
    except ModelLoadError:
        raise
    except Exception as e:  # engine.formats then names the merge at fault, if one is
        raise WrongMetadataType(
            path, f"the vocabulary (tokenizer.ggml.tokens/merges) is invalid: {' '.join(str(e).split())[:200]}"
        ) from e


def _byte_level_bpe(tokens: list[str], merges: list[str], types: list[int], pre: str) -> Any:
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HFTokenizer

    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tk = HFTokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, ignore_merges=False))
    if pre not in PRE_SPLITS:
        log.warning("unknown pre-tokenizer %r; using GPT-2's split", pre)
    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in PRE_SPLITS.get(pre, (_GPT2_SPLIT,))]
    tk.pre_tokenizer = pre_tokenizers.Sequence(
        splits + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tk.decoder = decoders.ByteLevel()
    special = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == CONTROL]
    user = [AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types) if ty == USER_DEFINED]
    tk.add_special_tokens(special)
    tk.add_tokens(user)
    return tk


def _required(meta: dict, key: str, path: Path) -> list[str]:
    value = meta.get(key)
    if not isinstance(value, list):
        raise MissingMetadata(path, f"metadata key {key} is missing (a gpt2 tokenizer needs it)")
    return value


def from_hf_dir(directory: Path) -> Tokenizer:
    from tokenizers import Tokenizer as HFTokenizer

    # engine.formats (open_model) has checked the files' kinds, sizes and JSON before this runs
    tj = directory / "tokenizer.json"
    if not tj.exists():
        raise MissingMetadata(directory, "tokenizer.json is missing", "copy it from the model's repository")
    try:
        backend = HFTokenizer.from_file(str(tj))
    except Exception as e:
        raise WrongMetadataType(
            tj,
            f"cannot be read as a tokenizer: {' '.join(str(e).split())[:200]}",
            "download tokenizer.json again from the model's repository",
        ) from e
    cfg_path = directory / "tokenizer_config.json"
    cfg = _read_json(cfg_path)
    model_cfg = _read_json(directory / "config.json")
    bos_token, eos_token = (_token_field(cfg_path, cfg, k) for k in ("bos_token", "eos_token"))
    bos_id = (
        _token_id(backend, bos_token) if bos_token else _id_field(directory / "config.json", model_cfg, "bos_token_id")
    )
    eos = _id_field(directory / "config.json", model_cfg, "eos_token_id", many=True)
    eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
    if eos_token:
        eos_ids = tuple(dict.fromkeys(eos_ids + (_token_id(backend, eos_token),)))
    tok = Tokenizer(
        backend,
        bos_id=bos_id,
        eos_ids=tuple(i for i in eos_ids if i is not None),
        add_bos=cfg.get("add_bos_token") is True,
        chat_template=cfg.get("chat_template"),
        template_source=(cfg_path, "chat_template"),
        fallback=_fallback(
            backend, model_cfg.get("model_type"), sentencepiece=(cfg.get("tokenizer_class") or "").startswith("Llama")
        ),
    )
    tok.source = tj
    return tok


def _token_field(path: Path, cfg: dict, key: str) -> str | None:
    """A special token of tokenizer_config.json: a string, or an object whose content is one."""
    token = cfg.get(key)
    text = token.get("content") if isinstance(token, dict) else token
    if token is not None and not isinstance(text, str):
        raise WrongMetadataType(
            path,
            f"field {key} is {_shown(token)}; it must be a token string or an object with a string content",
            "fix the field, or download the file again",
        )
    return text or None


def _id_field(path: Path, cfg: dict, key: str, many: bool = False) -> Any:  # int | list[int] | None
    """A token id of config.json: a non-negative integer (or, with ``many``, a list of them)."""
    v = cfg.get(key)
    ok = lambda x: type(x) is int and x >= 0  # noqa: E731
    if v is None or ok(v) or (many and isinstance(v, list) and all(map(ok, v))):
        return v
    raise WrongMetadataType(
        path,
        f"field {key} is {_shown(v)}; it must be a token id (an integer ≥ 0){' or a list of them' if many else ''}",
        "fix the field, or download the file again",
    )


def _shown(v: object) -> str:
    text = json.dumps(v) if not isinstance(v, (dict, list)) or len(str(v)) < 60 else f"a JSON {type(v).__name__}"
    return text[:80]


def _fallback(backend: Any, family: object, sentencepiece: bool) -> FallbackTemplate:
    """The chat format for a file without a template (engine.tokenizer.fallback): its vocabulary's
    markers first, then its family."""
    from opscope.engine.tokenizer.fallback import fallback_for

    family = family if isinstance(family, str) else None
    return fallback_for(family, lambda t: backend.token_to_id(t) is not None, sentencepiece)


def _token_id(backend: Any, token: str) -> int | None:
    found = backend.token_to_id(token)
    return None if found is None else int(found)


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as e:
        raise WrongMetadataType(path, f"is not valid JSON: {' '.join(str(e).split())[:200]}") from None
    if not isinstance(value, dict):
        raise WrongMetadataType(path, "holds no JSON object")
    return value
