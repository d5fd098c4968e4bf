"""Tokenizer built from GGUF metadata vs the Hugging Face tokenizer loaded from the same file."""

from __future__ import annotations

import pytest

CORPUS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b  # sum\n",
    "for (int i = 0; i < 10; ++i) { x[i] = i * 2; }",
    "Prices: 12345, 3.14159, 1e-5 and 007.",
    "naïve café, Ελληνικά, русский, 日本語のテキスト, 한국어",
    "emoji 😀🎉👩‍👩‍👧 and flags 🇫🇷",
    "tabs\tand   many     spaces\n\n\nnewlines   \n",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|> special in the middle <|im_end|>",
    "   leading spaces and trailing   ",
    "",
    "I'm sure they'll say you've done it; we'd've.",
]


@pytest.fixture(scope="module")
def ref_tok(hf_tokenizer):
    return hf_tokenizer


@pytest.fixture(scope="module")
def tok(default_model_path):
    from opscope.engine.formats import open_model

    return open_model(default_model_path).tokenizer


@pytest.mark.parametrize("text", CORPUS)
def test_encode_matches_reference(tok, ref_tok, text):
    assert tok.encode(text) == ref_tok(text, add_special_tokens=True).input_ids


@pytest.mark.parametrize("text", CORPUS)
def test_decode_round_trips_like_reference(tok, ref_tok, text):
    ids = tok.encode(text)
    assert tok.decode(ids) == ref_tok.decode(ids) == text


def test_special_tokens_from_metadata(tok):
    assert tok.bos_id == 1 and tok.eos_ids == (2,) and tok.add_bos is False
    assert tok.encode("<|im_start|>") == [1]


def test_stream_decoder_never_splits_a_character(tok):
    ids = tok.encode("日本語 😀 ok")
    stream = tok.stream()
    pieces = [stream.push(i) for i in ids] + [stream.flush()]
    assert "".join(pieces) == "日本語 😀 ok"
    assert not any("\ufffd" in p for p in pieces)


def test_chat_template_matches_reference(tok, ref_tok):
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "2+2?"},
    ]
    assert tok.apply_chat_template(msgs) == ref_tok.apply_chat_template(
        msgs, tokenize=False, add_generation_prompt=True
    )


def test_chat_template_is_sandboxed():
    from opscope.engine.core.errors import ModelFormatError
    from opscope.engine.tokenizer.loader import Tokenizer

    hostile = "{{ ''.__class__.__mro__[1].__subclasses__() }}"
    t = Tokenizer(None, bos_id=None, eos_ids=(), add_bos=False, chat_template=hostile)
    with pytest.raises(ModelFormatError, match="chat template"):
        t.apply_chat_template([{"role": "user", "content": "x"}])
