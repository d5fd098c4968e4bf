"""Hostile model files beyond tests/engine/formats/test_hostile_files.py (issue 19, second audit): GGUF tokenizer
arrays that disagree, tensor sizes that overflow, Hugging Face JSON files that are huge, deep, not
JSON or of the wrong types, tokenizer.json regexes that backtrack without bound, token ids past the
embedding, shards missing or outside the directory. One file per defect, generated here from a
valid tiny model (engine.testing.gguf_writer, rebuilt with the ggml project's own reader in
tests/support/gguf_craft.py); each is refused by open_model with one line naming the file, the key
or tensor, and what to do, as its ModelLoadError class."""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from gguf_craft import ARRAY, I32, STRING, U32
from opscope.engine.core import errors as E
from opscope.engine.formats import open_model
from opscope.engine.formats.tokenizer_checks import REGEX_FIX, nested_quantifier

DAMAGED = "the file is damaged or was not written by a GGUF/safetensors converter; download or convert it again"
VOCAB = "the file's vocabulary is damaged or was tampered with; convert the model again"
JSON_FIX = "the file is damaged or was not written by a model converter; download it again from the model's repository"
FIT = "the tokenizer does not fit the model's embedding; use the tokenizer files that came with these weights"


@pytest.fixture(scope="module")
def _hf_base(tmp_path_factory, tiny) -> Path:
    from opscope.engine.formats.hf_source import hf_name
    from opscope.engine.testing.gguf_writer import hf_config
    from safetensors.numpy import save_file

    src = open_model(tiny)
    d = tmp_path_factory.mktemp("hfbase") / "hf"
    d.mkdir()
    save_file({hf_name(n): np.ascontiguousarray(w) for n, w in src.iter_tensors()}, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps(hf_config("llama")))
    src.tokenizer.backend.save(str(d / "tokenizer.json"))
    return d


@pytest.fixture
def hf(tmp_path, _hf_base) -> Path:
    d = tmp_path / "hf"
    shutil.copytree(_hf_base, d)
    return d


def _rejects(path, cls, message: str):
    with pytest.raises(cls) as info:
        open_model(path)
    assert str(info.value) == message
    assert "\n" not in str(info.value) and isinstance(info.value, E.ModelLoadError)
    return info.value


def _sparse(path: Path, size: int) -> Path:
    with open(path, "wb") as f:
        f.truncate(size)
    return path


# -- GGUF: tensor sizes ------------------------------------------------------------------------------
def test_tensor_whose_dimensions_multiply_past_any_size_is_not_a_truncated_download(tmp_path, craft):
    craft.tensor("output.weight").shape = (1 << 40, 1 << 40, 1 << 40, 1 << 40)  # the last tensor: "packed"
    p = craft.write(tmp_path / "dims.gguf")
    at = next(a for w, a, _ in craft.fields if w == "tensor name output.weight length")
    _rejects(
        p,
        E.LimitExceeded,
        f"{p}: tensor output.weight (entry at byte {at}) has shape "
        f"{(1 << 40,) * 4}: {2**160} elements, more than the {2**40} any model tensor "
        f"holds; {DAMAGED}",
    )


# -- GGUF: tokenizer arrays --------------------------------------------------------------------------
@pytest.mark.parametrize("key, n", [("tokenizer.ggml.token_type", 5), ("tokenizer.ggml.scores", 7)])
def test_vocabulary_array_of_another_length_than_the_tokens(tmp_path, craft, key, n):
    craft.set(key, [1] * n if key.endswith("type") else [0.0] * n, ARRAY, I32 if key.endswith("type") else 6)
    p = craft.write(tmp_path / "len.gguf")
    _rejects(
        p,
        E.InvalidHyperparameters,
        f"{p}: metadata key {key} holds {n} entries but tokenizer.ggml.tokens "
        f"holds 320 tokens; there must be one per token; {VOCAB}",
    )


def test_sentencepiece_scores_of_another_length(tmp_path, craft):
    craft.set("tokenizer.ggml.model", "llama", STRING).set("tokenizer.ggml.scores", [0.0] * 3, ARRAY, 6)
    p = craft.write(tmp_path / "spm.gguf")
    _rejects(
        p,
        E.InvalidHyperparameters,
        f"{p}: metadata key tokenizer.ggml.scores holds 3 entries but "
        f"tokenizer.ggml.tokens holds 320 tokens; there must be one per token; {VOCAB}",
    )


@pytest.mark.parametrize("value", [99, -1])
def test_token_type_out_of_range(tmp_path, craft, value):
    types = craft.kv("tokenizer.ggml.token_type").value
    types[7] = value
    p = craft.write(tmp_path / "type.gguf")
    _rejects(
        p,
        E.WrongMetadataType,
        f"{p}: metadata key tokenizer.ggml.token_type gives token 7 the type {value}; token types are 0 to 6; {VOCAB}",
    )


def test_empty_vocabulary(tmp_path, craft):
    craft.set("tokenizer.ggml.tokens", [], ARRAY, STRING).set("tokenizer.ggml.token_type", [], ARRAY, I32)
    p = craft.write(tmp_path / "empty.gguf")
    _rejects(
        p,
        E.MissingMetadata,
        f"{p}: metadata key tokenizer.ggml.tokens is an empty array: the vocabulary has no tokens; {VOCAB}",
    )


@pytest.mark.parametrize(
    "merge, cls, detail",
    [
        ("nospace", E.WrongMetadataType, "element 0 ('nospace') is not two tokens separated by a space"),
        ("qq zz", E.InvalidHyperparameters, "element 0 ('qq zz') names 'qq', which is not in tokenizer.ggml.tokens"),
    ],
)
def test_malformed_merge_is_named(tmp_path, craft, merge, cls, detail):
    craft.kv("tokenizer.ggml.merges").value[0] = merge
    p = craft.write(tmp_path / "merge.gguf")
    _rejects(p, cls, f"{p}: metadata key tokenizer.ggml.merges: {detail}; {VOCAB}")


def test_padding_id_outside_the_vocabulary_is_ignored_as_llama_cpp_does(tmp_path, craft, caplog):
    p = craft.set("tokenizer.ggml.padding_token_id", 10**6, U32).write(tmp_path / "pad.gguf")
    tok = open_model(p).tokenizer
    assert tok.pad_id == tok.eos_ids[0] == 0  # batch padding never indexes past the embedding
    assert "padding_token_id 1000000 names no token; ignored" in caplog.text


# -- Hugging Face JSON files ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, cap",
    [
        ("config.json", 16 << 20),
        ("tokenizer_config.json", 16 << 20),
        ("model.safetensors.index.json", 16 << 20),
        ("tokenizer.json", 64 << 20),
    ],
)
def test_huge_json_file_is_refused_before_it_is_read(hf, name, cap):
    p = _sparse(hf / name, cap + 1)
    _rejects(
        hf, E.LimitExceeded, f"{p}: is {cap + 1} bytes, over the cap of {cap} bytes for this JSON file; {JSON_FIX}"
    )


@pytest.mark.parametrize("name", ["config.json", "tokenizer_config.json", "model.safetensors.index.json"])
def test_deeply_nested_json(hf, name):
    (hf / name).write_text("[" * 100_000 + "]" * 100_000)
    _rejects(hf, E.LimitExceeded, f"{hf / name}: the JSON nests too deeply to read; {JSON_FIX}")


@pytest.mark.parametrize(
    "text, detail",
    [
        ('{"rms_norm_eps": NaN}', "is not valid JSON: NaN is not a JSON number"),
        ('{"hidden_size": ' + "9" * 5000 + "}", "is not valid JSON: a number has more digits than any real value"),
        (b'{"a": "\xff"}', "is not UTF-8 text (byte 7)"),
        ("[1]", "holds a JSON array, not an object"),
    ],
)
def test_config_json_that_is_not_a_json_object(hf, text, detail):
    p = hf / "config.json"
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    _rejects(hf, E.WrongMetadataType, f"{p}: {detail}; {JSON_FIX}")


@pytest.mark.parametrize(
    "field, value, shown", [("bos_token", 5, "5"), ("eos_token", {"content": 5}, '{"content": 5}')]
)
def test_special_token_of_the_wrong_type_in_tokenizer_config(hf, field, value, shown):
    p = hf / "tokenizer_config.json"
    p.write_text(json.dumps({field: value}))
    _rejects(
        hf,
        E.WrongMetadataType,
        f"{p}: field {field} is {shown}; it must be a token string or an object with a "
        f"string content; fix the field, or download the file again",
    )


def test_token_ids_in_config_json(hf):
    from opscope.engine.testing.gguf_writer import hf_config

    p = hf / "config.json"
    p.write_text(json.dumps({**hf_config("llama"), "eos_token_id": "x"}))
    _rejects(
        hf,
        E.WrongMetadataType,
        f'{p}: field eos_token_id is "x"; it must be a token id (an integer ≥ 0) or a '
        f"list of them; fix the field, or download the file again",
    )
    p.write_text(json.dumps({**hf_config("llama"), "eos_token_id": [2, 10**6]}))
    _rejects(
        hf,
        E.InvalidHyperparameters,
        f"{p}: field eos_token_id is 1000000, outside the model's 320 embedding rows; {FIT}",
    )


# -- tokenizer.json ----------------------------------------------------------------------------------------
def _edit_tokenizer(hf: Path, edit) -> Path:
    p = hf / "tokenizer.json"
    tj = json.loads(p.read_text())
    edit(tj)
    p.write_text(json.dumps(tj))
    return p


def test_malformed_tokenizer_json(hf):
    p = hf / "tokenizer.json"
    p.write_text("{not json")
    _rejects(
        hf,
        E.WrongMetadataType,
        f"{p}: cannot be read as a tokenizer: key must be a string at line 1 column 2; "
        f"download tokenizer.json again from the model's repository",
    )


def test_token_id_past_the_embedding(hf):
    p = _edit_tokenizer(hf, lambda tj: tj["model"]["vocab"].update({"zzzz": 5000}))
    _rejects(
        hf,
        E.InvalidHyperparameters,
        f"{p}: token 'zzzz' has id 5000 but the model has 320 embedding rows (config.json's vocab_size); {FIT}",
    )


def test_catastrophic_backtracking_pre_tokenizer_is_refused(hf):
    def edit(tj):
        tj["pre_tokenizer"] = {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": r"(\w+\s?)+$"}, "behavior": "Isolated", "invert": False},
                tj["pre_tokenizer"],
            ],
        }

    p = _edit_tokenizer(hf, edit)
    _rejects(
        hf,
        E.LimitExceeded,
        f"{p}: the pre-tokenizer regex '(\\\\w+\\\\s?)+$' repeats the group "
        f"'(\\\\w+\\\\s?)', which itself repeats without bound; {REGEX_FIX}",
    )


def test_a_runaway_regex_that_gets_past_the_check_is_one_error_not_a_panic(hf):
    """Oniguruma gives up after its retry limit with a Rust panic (a BaseException): encode turns
    it into LimitExceeded naming tokenizer.json."""
    from tokenizers import Regex, pre_tokenizers

    tok = open_model(hf).tokenizer
    tok.backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"(\w+\s?)+$"), behavior="isolated")  # past the check
    with pytest.raises(E.LimitExceeded) as info:
        tok.encode("a" * 256 + "!")
    assert str(info.value).startswith(f"{hf / 'tokenizer.json'}: the tokenizer gave up on this text: ")


def test_regex_check_passes_real_pre_tokenizers_and_catches_nested_quantifiers():
    from opscope.engine.tokenizer.loader import PRE_SPLITS

    real = [r for splits in PRE_SPLITS.values() for r in splits] + [
        r" ?[^(\s|[.,!?…。，、।۔،])]+",  # BLOOM: parentheses inside a class
        r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
        r"\p{N}{1,3}",
        r"(a{1,5})+",
        r"\{+",
    ]
    assert [r for r in real if nested_quantifier(r)] == []
    assert [nested_quantifier(r) for r in (r"(a+)+$", r"(\s*)*$", r"((a|b)+)+c", r"(?:a*){2,}", r"(\p{L}+)*")] == [
        "(a+)",
        r"(\s*)",
        "((a|b)+)",
        "(?:a*)",
        r"(\p{L}+)",
    ]


# -- shards ----------------------------------------------------------------------------------------------
def test_shard_listed_but_missing(hf):
    (hf / "model.safetensors.index.json").write_text(
        json.dumps(
            {
                "weight_map": {
                    "model.norm.weight": "model.safetensors",
                    "lm_head.weight": "model-00002-of-00002.safetensors",
                }
            }
        )
    )
    p = hf / "model-00002-of-00002.safetensors"
    _rejects(
        hf,
        E.MissingTensor,
        f"{p}: shard model-00002-of-00002.safetensors listed in model.safetensors.index.json "
        f"is missing; the download is incomplete: download every shard the index lists",
    )


@pytest.mark.parametrize("weight_map, shown", [(["a"], "a JSON array"), ({"a": 5}, None)])
def test_shard_index_of_the_wrong_shape(hf, weight_map, shown):
    p = hf / "model.safetensors.index.json"
    p.write_text(json.dumps({"weight_map": weight_map}))
    detail = (
        f"field weight_map is {shown}; it must be a non-empty object mapping tensor names to shard files"
        if shown
        else "weight_map holds 5 where a shard file name belongs"
    )
    _rejects(hf, E.WrongMetadataType, f"{p}: {detail}; fix the index, or download it again")


def test_shard_symlinked_to_a_device(hf):
    (hf / "model.safetensors").unlink()
    os.symlink("/dev/zero", hf / "model.safetensors")
    _rejects(
        hf,
        E.NotARegularFile,
        f"{hf / 'model.safetensors'}: is a character device, not a model file; give the "
        f"path of a .gguf or .safetensors file or of a Hugging Face model directory",
    )


def test_shard_symlinked_out_of_the_directory_is_read_as_what_it_points_at(hf, tmp_path):
    """The Hugging Face cache links every snapshot file to ../../blobs/: a symlink out of the
    directory is allowed, and what it points at is validated like any shard."""
    target = tmp_path / "blobs" / "abc"
    target.parent.mkdir()
    target.write_bytes(struct.pack("<Q", 2) + b"[]")
    (hf / "model.safetensors").unlink()
    os.symlink(target, hf / "model.safetensors")
    _rejects(
        hf,
        E.BadMagic,
        f"{hf / 'model.safetensors'}: not a safetensors file (header starts b'[]', expected a "
        f"JSON object); {E.BadMagic.fix}",
    )
