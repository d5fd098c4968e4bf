"""SentencePiece vocabularies from GGUF metadata (``tokenizer.ggml.model`` = "llama" or "gemma"):
Llama-2, Mistral v0.1-0.3, TinyLlama, Gemma.

A GGUF keeps the pieces, their scores and token types but no merges, so, like transformers' GGUF
converter, the vocabulary becomes a ``tokenizers`` BPE whose merges are recovered from the scores
(every split of a piece into two pieces that both exist, best score first), with byte fallback to
the ``<0xNN>`` tokens. That is the algorithm llama.cpp runs on these files (greedy merging of the
best-scored adjacent pair), and on a SentencePiece-BPE vocabulary it gives SentencePiece's own ids.

One deliberate difference from transformers' GGUF converter: the prefix space comes from a
normalizer (prepend "▁" to every text segment, then spaces → "▁"), as in SentencePiece, llama.cpp
and the original Llama tokenizer.json, not from ``Metaspace(prepend_scheme="first")``, which drops a
space from text that starts with one (" x" would encode like "x" and not round-trip) and adds no
prefix after a special token (llama.cpp does: "<s>[INST]" → "<s>", "▁[", ...).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opscope.engine.core.errors import MissingMetadata

UNKNOWN, CONTROL, USER_DEFINED = 2, 3, 4
SPACE = "\u2581"  # ▁, SentencePiece's visible space


@dataclass(frozen=True)
class SpmFlavor:
    """What differs between SentencePiece families.

    prefix_space: the default for ``tokenizer.ggml.add_space_prefix`` when the file does not say.
    merges_by_position: Gemma's scores do not follow its merge order; the order of the tokens in
    the file does (as transformers' ``gemma_tokenizer`` found).
    """

    name: str
    prefix_space: bool
    merges_by_position: bool


LLAMA = SpmFlavor("llama", prefix_space=True, merges_by_position=False)
GEMMA = SpmFlavor("gemma", prefix_space=False, merges_by_position=True)
_GEMMA_ARCHS = ("gemma", "gemma2", "gemma3")


def flavor_for(model: str, arch: str) -> SpmFlavor:
    """Gemma files say "llama" and are told apart by architecture (as transformers does); some say "gemma"."""
    return GEMMA if model == "gemma" or arch in _GEMMA_ARCHS else LLAMA


def spm_backend(meta: dict, path: Path) -> Any:  # a tokenizers.Tokenizer (untyped library)
    """A ``tokenizers.Tokenizer`` for the SentencePiece vocabulary in ``meta``."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models

    flavor = flavor_for(str(meta.get("tokenizer.ggml.model")), str(meta.get("general.architecture", "")))
    tokens = _tokens(meta, path, flavor)
    unk = _token_at(tokens, meta.get("tokenizer.ggml.unknown_token_id"))
    tk = HFTokenizer(
        models.BPE(
            vocab={t: i for i, t in enumerate(tokens)},
            merges=_merges(meta, path, tokens, flavor),
            fuse_unk=True,
            byte_fallback=True,
            dropout=None,
            unk_token=unk,
        )
    )
    _set_prefix_space(tk, bool(meta.get("tokenizer.ggml.add_space_prefix", flavor.prefix_space)))
    _add_special_tokens(tk, meta, tokens)
    return tk


def _set_prefix_space(tk: Any, prefix: bool) -> None:
    """Spaces are "▁" in the vocabulary; with a prefix space every text segment (the whole text, or
    the text after a special token, as llama.cpp cuts it) starts with one, which decoding drops."""
    from tokenizers import decoders, normalizers

    replace = normalizers.Replace(" ", SPACE)
    tk.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE), replace]) if prefix else replace
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    tk.decoder = decoders.Sequence(steps + ([decoders.Strip(content=" ", left=1, right=0)] if prefix else []))


def _add_special_tokens(tk: Any, meta: dict, tokens: list[str]) -> None:
    """llama.cpp matches control, unknown and user-defined tokens whole in the text; the first two
    (and the declared bos/eos/unk/pad) are special: ``skip_special_tokens`` drops them."""
    from tokenizers import AddedToken

    types = [int(t) for t in meta.get("tokenizer.ggml.token_type", ())]
    special = {i for i, ty in enumerate(types) if ty in (CONTROL, UNKNOWN)}
    special |= {int(meta[k]) for k in _SPECIAL_ID_KEYS if meta.get(k) is not None}
    tk.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in (_token_at(tokens, i) for i in sorted(special)) if t]
    )
    tk.add_tokens(
        [AddedToken(t, special=False, normalized=False) for t, ty in zip(tokens, types) if ty == USER_DEFINED and t]
    )


_SPECIAL_ID_KEYS = (
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.padding_token_id",
)


def _token_at(tokens: list[str], token_id: int | str | None) -> str | None:
    return tokens[int(token_id)] if token_id is not None and 0 <= int(token_id) < len(tokens) else None


def _tokens(meta: dict, path: Path, flavor: SpmFlavor) -> list[str]:
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens:
        raise MissingMetadata(
            path, "metadata key tokenizer.ggml.tokens is missing or empty (a SentencePiece vocabulary needs it)"
        )
    if flavor is GEMMA:
        # Gemma stores its runs-of-spaces tokens with real spaces; the normalized text has "▁".
        tokens = [SPACE * len(t) if t and not t.strip(" ") else t for t in tokens]
    return tokens


def _scores(meta: dict, path: Path, n: int, flavor: SpmFlavor) -> list[float]:
    if flavor.merges_by_position:
        return [-float(i) for i in range(n)]
    scores = meta.get("tokenizer.ggml.scores")  # a numpy array from the header reader
    if scores is None or isinstance(scores, (str, bytes)) or len(scores) != n:
        raise MissingMetadata(
            path,
            f"metadata key tokenizer.ggml.scores is missing or does not have one score "
            f"per token ({n}); a SentencePiece vocabulary needs it",
        )
    return [float(s) for s in scores]


def _merges(meta: dict, path: Path, tokens: list[str], flavor: SpmFlavor) -> list[tuple[str, str]]:
    listed = meta.get("tokenizer.ggml.merges")  # rare in SentencePiece files; used as given, like transformers
    if isinstance(listed, list) and listed:
        return [tuple(m.split(" ", 1)) for m in listed]
    scores = _scores(meta, path, len(tokens), flavor)
    from opscope.engine.tokenizer import spm_merges

    return spm_merges.cached_merges(tokens, scores, flavor.name)


def merges_from_scores(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """Every split of a token into two tokens of the vocabulary, ranked by the token's score (best
    first), ties to the longer left part. The same list, in the same order, as transformers'
    ``generate_merges`` makes, which is what the GGUF converter feeds its BPE model."""
    from opscope.engine.tokenizer import spm_merges

    return spm_merges.merges_from_scores(tokens, scores)
