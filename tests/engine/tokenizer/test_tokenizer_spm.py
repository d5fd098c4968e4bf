"""SentencePiece vocabularies in GGUF metadata (tokenizer.ggml.model "llama" / "gemma") against
independent references built from the same vocabulary.

There is no hub here, so the vocabularies are real SentencePiece models trained in the test (a BPE
and a Unigram, Llama-style: byte fallback, dummy prefix, no whitespace folding; and a Gemma-style BPE
without the prefix) and written into a GGUF the way llama.cpp's converter writes them. References:

- transformers' tokenizer from the same GGUF (``AutoTokenizer.from_pretrained(dir, gguf_file=...)``);
- for a Llama-style file, transformers' own prefix-space normalizer (its GGUF path for the "phi3"
  architecture, the same vocabulary under another architecture name). transformers' "llama" path
  uses ``Metaspace(prepend_scheme="first")``, which encodes " x" like "x" (it does not round-trip)
  and adds no prefix after a special token; SentencePiece and llama.cpp disagree with it there, so
  it is the reference only for text that starts with no space and holds no special token;
- the ``sentencepiece`` library itself, for the BPE vocabularies (a Unigram model runs Viterbi in
  SentencePiece, while a GGUF "llama" vocabulary is merged greedily by score in llama.cpp and
  transformers alike);
- llama.cpp itself (``llama-completion --verbose-prompt`` from ../shared/tools) for the Llama-style
  files.
"""

from __future__ import annotations

import random
import re
import subprocess
from pathlib import Path

import gguf
import numpy as np
import pytest
import sentencepiece as spm  # the test extra installs it
import transformers

REPO = Path(__file__).resolve().parents[3]
LLAMA_COMPLETION = REPO.parent / "shared" / "tools" / "llama.cpp" / "llama-completion"

CORPUS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b  # sum\n",
    "if x:\n\tif y:\n\t\treturn [i * 2 for i in range(10)]",
    "tabs\tand   many     spaces",
    "   leading spaces and trailing   ",
    " one leading space",
    "trailing newline\n",
    "\n\nblank lines first\n\n\n",
    "Prices: 12345, 3.14159, 1e-5 and 007.",
    "naïve café, résumé, Ελληνικά, русский",
    "日本語のテキスト, 한국어, 中文",
    "emoji 😀🎉👩‍👩‍👧 and flags 🇫🇷",
    "",
]
LLAMA_SPECIAL = ["<s>[INST] hi [/INST] ok</s>", "special <s> inside </s> text <unk> here"]
GEMMA_SPECIAL = ["<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n", "a <bos>b<eos> c <pad>"]

LLAMA2_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
    "{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}"
    "{% set system_message = false %}{% endif %}{% for message in loop_messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if loop.index0 == 0 and system_message != false %}"
    "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
    "{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}"
    "{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}"
    "{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"
)
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"
)


# -- fixtures: real SentencePiece models, written into GGUFs -----------------------------------------
def _training_text(seed: int = 0) -> str:
    """~20 KB of made-up words, code and punctuation: enough for a 600-piece vocabulary."""
    rnd = random.Random(seed)
    onsets = ["", "b", "c", "d", "f", "g", "h", "l", "m", "n", "p", "r", "s", "t", "v", "w", "st", "tr", "ch", "th"]
    nuclei = ["a", "e", "i", "o", "u", "ou", "ea", "ai"]
    codas = ["", "", "n", "r", "s", "t", "l", "nd", "ng", "ck"]
    words = [
        "".join(rnd.choice(onsets) + rnd.choice(nuclei) + rnd.choice(codas) for _ in range(rnd.randint(1, 3)))
        for _ in range(300)
    ] + "the quick brown fox jumps over lazy dog hello world".split()
    lines = [
        " ".join(rnd.choice(words) for _ in range(rnd.randint(4, 12))).capitalize() + rnd.choice(".,!?;")
        for _ in range(300)
    ]
    lines += ["def f(x):\n    return x + 1\n\tpass", "café naïve résumé", "12345 67890 3.14", "x = [1, 2, 3]"] * 4
    return "\n".join(lines)


def _train(workdir: Path, name: str, model_type: str, **options) -> Path:
    corpus = workdir / "corpus.txt"
    if not corpus.exists():
        corpus.write_text(_training_text(), encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(workdir / name),
        vocab_size=600,
        model_type=model_type,
        byte_fallback=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        character_coverage=1.0,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        num_threads=1,
        minloglevel=2,
        **options,
    )
    return workdir / f"{name}.model"


def _write_gguf(
    path: Path,
    model_file: Path,
    *,
    arch: str,
    tok_model: str = "llama",
    template: str | None = None,
    user_defined: tuple[str, ...] = (),
    add_eos: bool = False,
    shuffle: int | None = None,
    flat_scores: bool = False,
) -> Path:
    """Tokenizer metadata as llama.cpp's converter writes it (``_create_vocab_sentencepiece``), plus
    the few hyperparameters transformers reads to recognise the file (no tensors: not needed).
    ``shuffle`` (a seed) reorders the normal pieces, each keeping its score; ``flat_scores`` zeroes them."""
    sp = spm.SentencePieceProcessor(model_file=str(model_file))
    tokens, scores, types = [], [], []
    for i in range(sp.vocab_size()):
        piece = sp.IdToPiece(i)
        kind = (
            gguf.TokenType.UNKNOWN
            if sp.IsUnknown(i)
            else gguf.TokenType.CONTROL
            if sp.IsControl(i)
            else gguf.TokenType.UNUSED
            if sp.IsUnused(i)
            else gguf.TokenType.BYTE
            if sp.IsByte(i)
            else gguf.TokenType.USER_DEFINED
            if piece in user_defined
            else gguf.TokenType.NORMAL
        )
        tokens.append(piece.encode("utf-8"))
        scores.append(0.0 if flat_scores else sp.GetScore(i))
        types.append(int(kind))
    if shuffle is not None:
        normal = [i for i, t in enumerate(types) if t == gguf.TokenType.NORMAL]
        moved = random.Random(shuffle).sample(normal, len(normal))
        before = list(zip(tokens, scores))
        for dst, src in zip(normal, moved):
            tokens[dst], scores[dst] = before[src]
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(128)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model(tok_model)
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_unk_token_id(sp.unk_id())
    if sp.pad_id() >= 0:
        w.add_pad_token_id(sp.pad_id())
    w.add_add_bos_token(True)
    w.add_add_eos_token(add_eos)
    if template:
        w.add_chat_template(template)
    if arch == "llama":  # llama-completion needs a runnable model: random tiny weights
        _add_tiny_llama_tensors(w, len(tokens))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _add_tiny_llama_tensors(w, n_vocab: int, d: int = 64, ff: int = 128) -> None:
    rng = np.random.default_rng(0)
    rand = lambda *shape: (rng.standard_normal(shape) * 0.02).astype(np.float32)  # noqa: E731
    w.add_rope_dimension_count(16)
    w.add_tensor("token_embd.weight", rand(n_vocab, d))
    w.add_tensor("output_norm.weight", np.ones(d, np.float32))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(d, np.float32))
    w.add_tensor("blk.0.ffn_norm.weight", np.ones(d, np.float32))
    for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
        w.add_tensor(f"blk.0.{name}.weight", rand(d, d))
    w.add_tensor("blk.0.ffn_gate.weight", rand(ff, d))
    w.add_tensor("blk.0.ffn_up.weight", rand(ff, d))
    w.add_tensor("blk.0.ffn_down.weight", rand(d, ff))


class Vocab:
    """One trained vocabulary: its SentencePiece model, our tokenizer, and the references."""

    def __init__(
        self,
        root: Path,
        name: str,
        model_file: Path,
        *,
        arch: str,
        template: str,
        user_defined: tuple[str, ...] = (),
        compat_arch: str | None = None,
    ):
        from opscope.engine.formats import open_model

        self.name, self.model_file = name, model_file
        self.path = _write_gguf(
            root / name / "model.gguf", model_file, arch=arch, template=template, user_defined=user_defined
        )
        self.sp = spm.SentencePieceProcessor(model_file=str(model_file))
        self.tok = open_model(self.path).tokenizer
        self.ref = _hf(self.path)
        # the same vocabulary under an architecture whose transformers path prepends like SentencePiece
        self.ref_prefix = (
            _hf(
                _write_gguf(
                    root / f"{name}-{compat_arch}" / "model.gguf",
                    model_file,
                    arch=compat_arch,
                    template=template,
                    user_defined=user_defined,
                )
            )
            if compat_arch
            else self.ref
        )


def _hf(path: Path):
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.fixture(scope="module")
def vocabs(tmp_path_factory) -> dict[str, Vocab]:
    root = tmp_path_factory.mktemp("spm")
    llama_opts = dict(add_dummy_prefix=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1)
    gemma_opts = dict(
        add_dummy_prefix=False,
        pad_id=0,
        eos_id=1,
        bos_id=2,
        unk_id=3,
        pad_piece="<pad>",
        eos_piece="<eos>",
        bos_piece="<bos>",
        unk_piece="<unk>",
        user_defined_symbols=["<start_of_turn>", "<end_of_turn>"],
    )
    return {
        "llama-bpe": Vocab(
            root,
            "llama-bpe",
            _train(root, "llama-bpe", "bpe", **llama_opts),
            arch="llama",
            template=LLAMA2_TEMPLATE,
            compat_arch="phi3",
        ),
        "llama-unigram": Vocab(
            root,
            "llama-unigram",
            _train(root, "llama-unigram", "unigram", **llama_opts),
            arch="llama",
            template=LLAMA2_TEMPLATE,
            compat_arch="phi3",
        ),
        "gemma-bpe": Vocab(
            root,
            "gemma-bpe",
            _train(root, "gemma-bpe", "bpe", **gemma_opts),
            arch="gemma3",
            template=GEMMA_TEMPLATE,
            user_defined=("<start_of_turn>", "<end_of_turn>"),
        ),
    }


def _lines(name: str) -> list[str]:
    return CORPUS + (GEMMA_SPECIAL if name.startswith("gemma") else LLAMA_SPECIAL)


def _has_special(text: str) -> bool:
    return bool(re.search(r"<(s|/s|unk|pad|bos|eos)>", text))


NAMES = ["llama-bpe", "llama-unigram", "gemma-bpe"]


# -- encode ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_encode_matches_transformers(vocabs, name):
    v = vocabs[name]
    llama_style = name.startswith("llama")
    for text in _lines(name):
        ours = v.tok.encode(text)
        assert ours == v.ref_prefix(text).input_ids, (name, text)
        if not llama_style or not (text.startswith(" ") or _has_special(text)):
            assert ours == v.ref(text).input_ids, (name, text)


def test_transformers_llama_path_drops_a_leading_space(vocabs):
    """Why the Llama-style reference above is transformers' prefix normalizer: its "llama" GGUF path
    encodes " x" like "x", which SentencePiece does not, and cannot give " x" back."""
    v = vocabs["llama-bpe"]
    assert v.ref(" one leading space").input_ids == v.ref("one leading space").input_ids
    assert v.tok.encode(" one leading space") == [v.tok.bos_id] + v.sp.encode(" one leading space")
    assert v.tok.encode(" one leading space") != v.tok.encode("one leading space")


@pytest.mark.parametrize("name", ["llama-bpe", "gemma-bpe"])
def test_encode_matches_sentencepiece(vocabs, name):
    v = vocabs[name]
    for text in _lines(name):
        if _has_special(text):  # SentencePiece has no control tokens in text; llama.cpp test below
            continue
        assert v.tok.encode(text) == [v.tok.bos_id] + v.sp.encode(text), (name, text)


@pytest.mark.parametrize("name", ["llama-bpe", "llama-unigram"])
def test_encode_matches_llama_cpp(vocabs, name, tmp_path):
    if not LLAMA_COMPLETION.is_file():
        pytest.fail(
            f"llama-completion is missing at {LLAMA_COMPLETION}: this test needs llama.cpp's tools "
            f"(see ../shared/tools/llama.cpp/BUILD.md)"
        )
    v = vocabs[name]
    for i, text in enumerate(_lines(name)):
        prompt = tmp_path / f"{i}.txt"
        prompt.write_bytes(text.encode("utf-8"))
        assert v.tok.encode(text) == _llama_cpp_ids(v.path, prompt), (name, text)


def _llama_cpp_ids(model: Path, prompt: Path, attempts: int = 6) -> list[int]:
    """The prompt's ids as llama-completion prints them. Its logger runs on a thread and now and then
    loses the tail of the log at exit (rc 0), so a run counts only when every announced id is there;
    generating 64 tokens after the prompt (the tiny random model, EOS ignored) gives the logger time
    to write the prompt lines: with one token, 6 runs in a row lost them when every core was busy."""
    cmd = [
        str(LLAMA_COMPLETION),
        "-m",
        str(model),
        "-bf",
        str(prompt),
        "-n",
        "64",
        "--ignore-eos",
        "--verbose-prompt",
        "-no-cnv",
        "-t",
        "1",
        "--temp",
        "0",
    ]
    for _ in range(attempts):
        out = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=120)
        log = out.stderr + out.stdout
        count = re.search(r"number of tokens in prompt = (\d+)", log)
        ids = [int(m.group(1)) for m in re.finditer(r"^\S+ I +(\d+) -> '", log, re.M)]
        if count and len(ids) == int(count.group(1)):
            return ids
    raise AssertionError(
        f"no complete prompt token list from llama-completion in {attempts} runs (last exit code "
        f"{out.returncode}):\n{log[-2000:]}"
    )


def test_merge_order_comes_from_scores_for_llama_and_from_positions_for_gemma(vocabs, tmp_path):
    """A SentencePiece file lists its pieces best first, so scores and positions agree on it; these
    files make them disagree. Llama's merges follow the scores, Gemma's the positions (its scores
    do not follow its merge order), as in transformers."""
    from opscope.engine.formats import open_model

    shuffled = _write_gguf(
        tmp_path / "llama" / "model.gguf", vocabs["llama-unigram"].model_file, arch="llama", shuffle=1
    )
    flat = _write_gguf(
        tmp_path / "gemma" / "model.gguf",
        vocabs["gemma-bpe"].model_file,
        arch="gemma3",
        flat_scores=True,
        user_defined=("<start_of_turn>", "<end_of_turn>"),
    )
    for path, lines in ((shuffled, CORPUS), (flat, _lines("gemma-bpe"))):
        tok, ref = open_model(path).tokenizer, _hf(path)
        for text in lines:
            if not text.startswith(" "):
                assert tok.encode(text) == ref(text).input_ids, (path, text)


def test_gemma_model_name_is_the_gemma_vocabulary(vocabs, tmp_path):
    """Some files say tokenizer.ggml.model = "gemma" whatever their architecture."""
    from opscope.engine.formats import open_model

    v = vocabs["gemma-bpe"]
    path = _write_gguf(
        tmp_path / "model.gguf",
        v.model_file,
        arch="llama",
        tok_model="gemma",
        user_defined=("<start_of_turn>", "<end_of_turn>"),
    )
    tok = open_model(path).tokenizer
    for text in _lines("gemma-bpe"):
        assert tok.encode(text) == v.ref(text).input_ids, text


def test_byte_fallback_is_exercised(vocabs):
    v = vocabs["llama-bpe"]
    ids = v.tok.encode("😀", add_special_tokens=False)
    assert [v.tok.token_text(i) for i in ids] == ["▁", "<0xF0>", "<0x9F>", "<0x98>", "<0x80>"]


# -- decode ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_decode_round_trips_like_references(vocabs, name):
    v = vocabs[name]
    for text in _lines(name):
        ids = v.tok.encode(text)
        for skip in (False, True):
            assert v.tok.decode(ids, skip_special_tokens=skip) == v.ref.decode(ids, skip_special_tokens=skip)
        if not _has_special(text):
            assert v.tok.decode(ids, skip_special_tokens=True) == text == v.sp.decode(ids[1:]), (name, text)


@pytest.mark.parametrize("name", NAMES)
def test_stream_decoder_matches_decode_without_broken_characters(vocabs, name):
    v = vocabs[name]
    for text in _lines(name):
        ids = v.tok.encode(text, add_special_tokens=False)
        stream = v.tok.stream()
        pieces = [stream.push(i) for i in ids] + [stream.flush()]
        assert "".join(pieces) == v.tok.decode(ids), (name, text)
        assert not any("\ufffd" in p for p in pieces), (name, text, pieces)


def test_stream_holds_a_character_split_over_byte_tokens(vocabs):
    v = vocabs["llama-bpe"]
    ids = v.tok.encode("a 😀 b", add_special_tokens=False)
    stream = v.tok.stream()
    pieces = [stream.push(i) for i in ids]
    assert "😀" in pieces  # whole, in one piece, after four byte tokens
    assert "".join(pieces) + stream.flush() == "a 😀 b"


# -- special tokens and options ------------------------------------------------------------------------
def test_special_tokens_from_metadata(vocabs):
    llama, gemma = vocabs["llama-bpe"].tok, vocabs["gemma-bpe"].tok
    assert (llama.bos_id, llama.eos_ids, llama.add_bos, llama.add_eos) == (1, (2,), True, False)
    assert (gemma.bos_id, gemma.eos_ids, gemma.pad_id) == (2, (1,), 0)
    assert llama.encode("</s>", add_special_tokens=False) == [2]
    assert gemma.encode("<end_of_turn>", add_special_tokens=False) == [gemma.backend.token_to_id("<end_of_turn>")]


def test_add_eos_token_from_metadata(vocabs, tmp_path):
    from opscope.engine.formats import open_model

    v = vocabs["llama-bpe"]
    path = _write_gguf(tmp_path / "model.gguf", v.model_file, arch="llama", add_eos=True)
    tok = open_model(path).tokenizer
    ids = tok.encode("Hello world")
    assert ids[0] == 1 and ids[-1] == 2
    assert ids == _hf(path)("Hello world").input_ids


# -- chat ----------------------------------------------------------------------------------------------
CHATS = {
    "llama-bpe": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "2+2?"},
    ],
    "gemma-bpe": [
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "2+2?"},
    ],
}


@pytest.mark.parametrize("name", list(CHATS))
def test_chat_template_renders_and_encodes_with_one_bos(vocabs, name):
    v, msgs = vocabs[name], CHATS[name]
    text = v.tok.apply_chat_template(msgs, add_generation_prompt=True)
    assert text == v.ref.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    ids = v.tok.encode(text, add_special_tokens=False)  # what LoadedModel.chat does
    ref_ids = v.ref_prefix.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True, return_dict=False)
    assert ids == list(ref_ids)
    assert ids[0] == v.tok.bos_id and ids[1] != v.tok.bos_id
    if name.startswith("llama"):
        assert ids.count(v.tok.bos_id) == 2  # one per [INST] turn, as the template writes them


def test_llama_chat_prompt_matches_llama_cpp(vocabs, tmp_path):
    if not LLAMA_COMPLETION.is_file():
        pytest.fail(f"llama-completion is missing at {LLAMA_COMPLETION}")
    v = vocabs["llama-bpe"]
    text = v.tok.apply_chat_template(CHATS["llama-bpe"])
    prompt = tmp_path / "chat.txt"
    prompt.write_bytes(text.encode("utf-8"))
    # llama.cpp adds its own BOS in front of the rendered prompt (and warns about the second one)
    assert [v.tok.bos_id] + v.tok.encode(text, add_special_tokens=False) == _llama_cpp_ids(v.path, prompt)


# -- refused vocabularies --------------------------------------------------------------------------------
@pytest.mark.parametrize("model", ["bert", "rwkv", "t5"])
def test_unsupported_tokenizer_model_is_one_clear_line(vocabs, tmp_path, model):
    from opscope.engine.core.errors import UnsupportedModelError
    from opscope.engine.formats import open_model

    path = _write_gguf(tmp_path / "model.gguf", vocabs["llama-bpe"].model_file, arch="llama", tok_model=model)
    with pytest.raises(UnsupportedModelError) as err:
        open_model(path)
    msg = str(err.value)
    assert "\n" not in msg and str(path) in msg and "tokenizer.ggml.model" in msg and repr(model) in msg


def test_missing_scores_is_a_format_error(vocabs, tmp_path):
    from opscope.engine.core.errors import ModelFormatError
    from opscope.engine.tokenizer.loader import from_gguf

    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>", "▁a"]}
    with pytest.raises(ModelFormatError, match="tokenizer.ggml.scores"):
        from_gguf(meta, tmp_path / "x.gguf")


# -- merges: built fast, cached as data ---------------------------------------------------------------
def _bpe_like_vocab(n: int, seed: int = 0) -> list[str]:
    """Pieces as a BPE trainer makes them (each one two earlier pieces), with byte tokens, astral
    characters, a piece given twice and an empty one: what a synthetic Gemma-style vocabulary holds."""
    rnd = random.Random(seed)
    pieces = list("abcdeghilmnorstu▁.,'") + ["\U0001f600", "é", "語"]
    seen = set(pieces)
    while len(pieces) < n:
        recent = rnd.random() < 0.5
        a = pieces[rnd.randrange(max(0, len(pieces) - 2000) if recent else 0, len(pieces))]
        b = pieces[rnd.randrange(min(300, len(pieces)))]
        if len(a + b) <= 12 and a + b not in seen:
            seen.add(a + b)
            pieces.append(a + b)
    return ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"<0x{b:02X}>" for b in range(256)] + pieces + ["ab", ""]


@pytest.mark.parametrize("scores", ["positions", "tied"])
def test_merges_equal_transformers_generate_merges(scores):
    """The vectorised construction against transformers' own loop, in order, ties included."""
    from opscope.engine.tokenizer.spm import merges_from_scores
    from transformers.convert_slow_tokenizer import generate_merges

    tokens = _bpe_like_vocab(8_000)
    values = (
        [-float(i) for i in range(len(tokens))]
        if scores == "positions"
        else [float(random.Random(i).choice([0.0, -1.5, 3.0])) for i in range(len(tokens))]
    )
    ref = generate_merges({t: i for i, t in enumerate(tokens)}, list(zip(tokens, values)))
    assert len(ref) > 6_000
    assert merges_from_scores(tokens, values) == ref


def _gemma_meta(tokens: list[str]) -> dict:
    types = [3] * 4 + [6] * 256 + [1] * (len(tokens) - 260)
    return {
        "general.architecture": "gemma3",
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": np.zeros(len(tokens), np.float32),
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 2,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.unknown_token_id": 3,
        "tokenizer.ggml.padding_token_id": 0,
    }


SAMPLE = "▁the café 😀 語ab, 'stud'. hello\tworld  éé"


def _cache_files(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "cache" / "spm-merges").glob("*.npy"))


def test_merges_are_cached_sealed_and_a_bad_cache_is_rebuilt(tmp_path, monkeypatch):
    """One .npy of token ids per vocabulary; a file cut short, tampered with or holding a pickle is
    ignored (never unpickled) and rebuilt, and the tokens stay those of the fresh build."""
    from opscope.engine.tokenizer.loader import from_gguf

    monkeypatch.setenv("OPSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    meta = _gemma_meta(_bpe_like_vocab(5_000, seed=3))
    fresh = from_gguf(meta, tmp_path / "m.gguf")
    expected = fresh.encode(SAMPLE)
    (file,) = _cache_files(tmp_path)
    good = file.read_bytes()
    assert good.startswith(b"\x93NUMPY") and np.load(file, allow_pickle=False).dtype == np.int32
    assert from_gguf(meta, tmp_path / "m.gguf").encode(SAMPLE) == expected  # from the cache

    marker = tmp_path / "unpickled"
    bad = {
        "truncated": good[: len(good) // 2],
        "tampered": good[:-8] + bytes(8),
        "pickle": _pickled_npy(marker),
        "garbage": b"not a numpy file",
    }
    for name, content in bad.items():
        file.write_bytes(content)
        assert from_gguf(meta, tmp_path / "m.gguf").encode(SAMPLE) == expected, name
        assert file.read_bytes() == good, name  # rebuilt and sealed again
    assert not marker.exists()


class _Boom:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def _pickled_npy(marker: Path) -> bytes:
    import io

    buf = io.BytesIO()
    np.save(buf, np.array([_Boom(str(marker))], dtype=object), allow_pickle=True)
    return buf.getvalue()


def test_unwritable_cache_dir_still_loads(tmp_path, monkeypatch):
    from opscope.engine.tokenizer.loader import from_gguf

    blocker = tmp_path / "file"
    blocker.write_text("")
    meta = _gemma_meta(_bpe_like_vocab(3_000, seed=4))
    monkeypatch.setenv("OPSCOPE_CACHE_DIR", str(tmp_path / "ok"))
    expected = from_gguf(meta, tmp_path / "m.gguf").encode(SAMPLE)
    monkeypatch.setenv("OPSCOPE_CACHE_DIR", str(blocker / "cache"))  # a dir under a file: mkdir fails
    assert from_gguf(meta, tmp_path / "m.gguf").encode(SAMPLE) == expected


def test_pieces_that_share_a_hash_still_give_transformers_merges():
    """Thue–Morse strings of length 2048 and their complements have the same polynomial hash modulo
    2**64 for any odd base: a vocabulary crafted with them takes the exact path, same merges."""
    from opscope.engine.tokenizer import spm_merges
    from opscope.engine.tokenizer.spm import merges_from_scores
    from transformers.convert_slow_tokenizer import generate_merges

    thue_morse = "".join("ab"[bin(i).count("1") % 2] for i in range(2048))
    other = thue_morse.translate(str.maketrans("ab", "ba"))
    tokens = _bpe_like_vocab(600, seed=5) + [thue_morse, other, thue_morse[:1024], other[:1024], thue_morse[1024:]]
    assert spm_merges._vectorised(list(dict.fromkeys(tokens))) is None  # the collision is real
    scores = [-float(i) for i in range(len(tokens))]
    assert merges_from_scores(tokens, scores) == generate_merges(
        {t: i for i, t in enumerate(tokens)}, list(zip(tokens, scores))
    )
