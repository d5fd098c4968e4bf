"""Tokenizer data from model files, checked before a tokenizer is built from it or fed a prompt.

GGUF: the vocabulary arrays (``tokenizer.ggml.tokens`` / ``scores`` / ``token_type`` / ``merges``)
describe one token per position, so their lengths must agree (llama.cpp indexes the others by the
token's position and would read past a short array), token types are llama.cpp's 0…6, the
vocabulary is not empty, and (when the tokenizers library refuses the vocabulary, to say where) every
merge is two tokens of the vocabulary separated by a space.

Hugging Face: the regular expressions of tokenizer.json's pre-tokenizer and normalizer run on every
prompt. Oniguruma (the ``tokenizers`` library's engine) stops a runaway match after its retry limit,
seconds later, by a Rust panic; a pattern with a quantified group that itself holds an unbounded
quantifier (``(a+)+``, ``(\\s*)*``, ``((a|b)+)+``: the classic catastrophic-backtracking shape,
which no real tokenizer uses) is refused when the file is opened. Every token id the tokenizer can
produce must have an embedding row.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from opscope.engine.core.errors import InvalidHyperparameters, LimitExceeded, MissingMetadata, WrongMetadataType

if TYPE_CHECKING:
    from opscope.engine.tokenizer.loader import Tokenizer

TOKEN_TYPES = range(7)  # llama_token_type: undefined, normal, unknown, control, user-defined, unused, byte
REGEX_FIX = (
    "its regular expression can backtrack exponentially (a quantified group holding an unbounded "
    "quantifier); use the tokenizer.json from the model's repository"
)
_GGUF_VOCAB_FIX = "the file's vocabulary is damaged or was tampered with; convert the model again"
_VOCAB_FIX = "the tokenizer does not fit the model's embedding; use the tokenizer files that came with these weights"


# -- GGUF ----------------------------------------------------------------------------------------------
def check_gguf_vocabulary(path: Path, meta: dict) -> None:
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list):
        return  # absent: the tokenizer builder names the missing key; a wrong type: gguf_spec did
    if not tokens:
        raise MissingMetadata(
            path, "metadata key tokenizer.ggml.tokens is an empty array: the vocabulary has no tokens", _GGUF_VOCAB_FIX
        )
    n = len(tokens)
    for key in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        v = meta.get(key)
        if v is not None and len(v) != n:
            raise InvalidHyperparameters(
                path,
                f"metadata key {key} holds {len(v)} entries but tokenizer.ggml.tokens "
                f"holds {n} tokens; there must be one per token",
                _GGUF_VOCAB_FIX,
            )
    types = meta.get("tokenizer.ggml.token_type")
    if types is not None and len(types):
        arr = np.asarray(types)
        bad = np.flatnonzero((arr < TOKEN_TYPES.start) | (arr >= TOKEN_TYPES.stop))
        if bad.size:
            raise WrongMetadataType(
                path,
                f"metadata key tokenizer.ggml.token_type gives token {int(bad[0])} the type "
                f"{int(arr[bad[0]])}; token types are {TOKEN_TYPES.start} to "
                f"{TOKEN_TYPES.stop - 1}",
                _GGUF_VOCAB_FIX,
            )


def check_gguf_merges(path: Path, meta: dict) -> None:
    """Each merge two tokens of the vocabulary separated by a space. Run when the tokenizers library
    has refused the vocabulary (it checks the same, ~10× faster than Python could on 50k merges,
    but its message names no element)."""
    tokens, merges = meta.get("tokenizer.ggml.tokens") or [], meta.get("tokenizer.ggml.merges")
    if isinstance(merges, list):
        _check_merges(path, merges, set(tokens))


def _check_merges(path: Path, merges: list[str], vocab: set[str]) -> None:
    for i, m in enumerate(merges):
        left, sep, right = m.partition(" ")
        if not sep or not left or not right:
            raise WrongMetadataType(
                path,
                f"metadata key tokenizer.ggml.merges: element {i} ({m[:60]!r}) is not two tokens separated by a space",
                _GGUF_VOCAB_FIX,
            )
        for part in (left, right):
            if part not in vocab:
                raise InvalidHyperparameters(
                    path,
                    f"metadata key tokenizer.ggml.merges: element {i} ({m[:60]!r}) "
                    f"names {part[:40]!r}, which is not in tokenizer.ggml.tokens",
                    _GGUF_VOCAB_FIX,
                )


# -- Hugging Face tokenizer.json -----------------------------------------------------------------------
def check_hf_tokenizer(path: Path, backend: Any) -> None:  # a tokenizers.Tokenizer (untyped library)
    """Refuse a pre-tokenizer or normalizer regex with nested unbounded quantifiers."""
    for part in ("pre_tokenizer", "normalizer"):
        component = getattr(backend, part, None)
        if component is None:
            continue
        for pattern in _regexes(json.loads(component.__getstate__())):
            group = nested_quantifier(pattern)
            if group is not None:
                raise LimitExceeded(
                    path,
                    f"the {part.replace('_', '-')} regex {pattern[:80]!r} repeats the group "
                    f"{group[:40]!r}, which itself repeats without bound",
                    REGEX_FIX,
                )


def check_token_ids_fit(directory: Path, tokenizer: Tokenizer, vocab_size: int) -> None:
    """Every id in tokenizer.json (vocabulary and added tokens), and the bos/eos ids config.json
    gives, has a row in the embedding."""
    path = directory / "tokenizer.json"
    for name, ids in (("bos_token_id", (tokenizer.bos_id,)), ("eos_token_id", tokenizer.eos_ids)):
        bad = [i for i in ids if i is not None and not 0 <= i < vocab_size]
        if bad:
            raise InvalidHyperparameters(
                directory / "config.json",
                f"field {name} is {bad[0]}, outside the model's {vocab_size} embedding rows",
                _VOCAB_FIX,
            )
    vocab = tokenizer.backend.get_vocab(with_added_tokens=True)
    if vocab:
        token, top = max(vocab.items(), key=lambda kv: kv[1])
        if top >= vocab_size:
            raise InvalidHyperparameters(
                path,
                f"token {token[:40]!r} has id {top} but the model has {vocab_size} "
                f"embedding rows (config.json's vocab_size)",
                _VOCAB_FIX,
            )


def _regexes(node: object) -> list[str]:
    if isinstance(node, dict):
        found = [node["Regex"]] if isinstance(node.get("Regex"), str) else []
        return found + [r for v in node.values() for r in _regexes(v)]
    if isinstance(node, list):
        return [r for v in node for r in _regexes(v)]
    return []


def nested_quantifier(pattern: str) -> str | None:
    """The first group that repeats without bound (``*``, ``+``, ``{n,}``) and holds an unbounded
    repetition itself, or None. Character classes and escapes (``\\p{L}``) are skipped."""
    stack: list[list] = []  # [start, holds an unbounded repetition]
    closed = None  # (start, end, holds) of the group just closed, if the next token may quantify it
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            i = _skip_escape(pattern, i)
            closed = None
        elif c == "[":
            i = _skip_class(pattern, i)
            closed = None
        elif c == "(":
            stack.append([i, False])
            i += 1
            closed = None
        elif c == ")" and stack:
            start, holds = stack.pop()
            if holds and stack:
                stack[-1][1] = True
            closed = (start, i, holds)
            i += 1
        elif c in "*+?{":
            end, unbounded = _quantifier(pattern, i)
            if end == i:  # a literal "{"
                closed, i = None, i + 1
                continue
            if unbounded:
                if closed is not None and closed[2]:
                    return pattern[closed[0] : closed[1] + 1]
                if stack:
                    stack[-1][1] = True
            closed, i = None, end
        else:
            closed, i = None, i + 1
    return None


def _skip_escape(p: str, i: int) -> int:
    j = i + 2
    if i + 1 < len(p) and p[i + 1] in "pPxuk" and j < len(p) and p[j] == "{":
        close = p.find("}", j)
        return close + 1 if close >= 0 else len(p)
    return j


def _skip_class(p: str, i: int) -> int:
    depth, j = 0, i
    while j < len(p):
        c = p[j]
        if c == "\\":
            j += 2
            continue
        if c == "[":
            depth += 1
            if p[j + 1 : j + 2] == "^":
                j += 1
            if p[j + 1 : j + 2] == "]":  # a "]" first in a class is literal
                j += 1
        elif c == "]":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return len(p)


def _quantifier(p: str, i: int) -> tuple[int, bool]:
    """(index after the quantifier at ``i``, whether it is unbounded); (i, False) if none."""
    c = p[i]
    if c == "{":
        close = p.find("}", i)
        body = p[i + 1 : close] if close > i else ""
        lo, comma, hi = body.partition(",")
        if (
            not body
            or not (lo.strip().isdigit() or (comma and not lo.strip()))
            or (hi.strip() and not hi.strip().isdigit())
        ):
            return i, False
        end, unbounded = close + 1, bool(comma) and not hi.strip()
    else:
        end, unbounded = i + 1, c in "*+"
    if end < len(p) and p[end] in "?+":  # lazy or possessive
        end += 1
    return end, unbounded
