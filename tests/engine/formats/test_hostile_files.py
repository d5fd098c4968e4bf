"""Hostile and malformed model files (issue 19): one file per defect, each differing from a valid
file in exactly that defect, each rejected before anything is allocated from it with one line that
names the file, the key/tensor/offset and what to do, as its class of the ModelLoadError family.

Valid files come from engine.testing.gguf_writer (llama.cpp's naming) and are parsed and rebuilt
with the ggml project's own gguf.GGUFReader (tests/support/gguf_craft.py), not with OpScope's reader.
"""

from __future__ import annotations

import copy
import json
import os
import pickle
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf_craft import ARRAY, F32, I32, STRING, U32, U64
from opscope.engine.core import errors as E
from opscope.engine.formats import open_model

U8, F64 = 0, 12  # GGUF value type ids gguf_craft does not name
DAMAGED = "the file is damaged or was not written by a GGUF/safetensors converter; download or convert it again"


def _rejects(path, cls, message: str):
    with pytest.raises(cls) as info:
        open_model(path)
    assert str(info.value) == message
    assert "\n" not in str(info.value)
    return info.value


def _cli(*args, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "opscope.engine.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=Path(__file__).resolve().parents[3],
    )


def test_the_valid_file_opens(tiny):
    assert open_model(tiny).config.n_layers == 2


# -- not a regular file ------------------------------------------------------------------------------
def test_named_pipe_is_not_reported_as_empty(tmp_path):
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    _rejects(
        fifo,
        E.NotARegularFile,
        f"{fifo}: is a named pipe, not a model file; give the path of a .gguf or "
        f".safetensors file or of a Hugging Face model directory",
    )


def test_dev_zero_is_not_reported_as_empty():
    _rejects(
        "/dev/zero",
        E.NotARegularFile,
        "/dev/zero: is a character device, not a model file; give the path "
        "of a .gguf or .safetensors file or of a Hugging Face model directory",
    )


# -- truncated, bad magic, version -------------------------------------------------------------------
def test_empty_file(tmp_path):
    p = tmp_path / "empty.gguf"
    p.touch()
    _rejects(p, E.Truncated, f"{p}: file is empty (0 bytes); {E.Truncated.fix}")


def test_cut_inside_the_metadata(tmp_path, tiny):
    p = tmp_path / "cut.gguf"
    p.write_bytes(tiny.read_bytes()[:3000])
    e = _rejects(
        p,
        E.Truncated,
        f"{p}: file ends at byte 3000, before the 320 items that the element count of "
        f"tokenizer.ggml.tokens at byte 669 announces (at least 2560 bytes); "
        f"{E.Truncated.fix}",
    )
    assert e.fix.startswith("the file is incomplete")


def test_cut_inside_the_tensor_data(tmp_path, tiny):
    p = tmp_path / "cut.gguf"
    p.write_bytes(tiny.read_bytes()[:-1000])
    _rejects(
        p,
        E.Truncated,
        f"{p}: tensor output.weight ends at data offset 123136 but the data section holds "
        f"only 122136 bytes; {E.Truncated.fix}",
    )


def test_bad_magic(tmp_path):
    p = tmp_path / "model.gguf"
    p.write_bytes(b"GGML" + b"\0" * 100)
    _rejects(
        p,
        E.BadMagic,
        f"{p}: not a GGUF file (magic b'GGML' at byte 0, expected b'GGUF') nor a .safetensors "
        f"file; give a .gguf file, a .safetensors file or a Hugging Face model directory",
    )


def test_unsupported_version(tmp_path, craft):
    craft.version = 7
    p = craft.write(tmp_path / "v7.gguf")
    e = _rejects(
        p,
        E.UnsupportedVersion,
        f"{p}: GGUF version 7 (at byte 4) is not supported; convert the model "
        f"again with a current llama.cpp (GGUF versions 2 and 3 are read)",
    )
    assert isinstance(e, E.UnsupportedModelError)  # existing except-clauses keep working


# -- limits ------------------------------------------------------------------------------------------
def test_key_count_beyond_the_file(tmp_path, craft):
    p = craft.write(tmp_path / "kv.gguf", n_kv=10**12)
    _rejects(
        p, E.LimitExceeded, f"{p}: metadata key count 1000000000000 at byte 16 exceeds the limit 100000; {DAMAGED}"
    )


def test_huge_alignment_is_not_blamed_on_a_download(tmp_path, craft):
    craft.set("general.alignment", 1 << 31, U32)
    p = craft.write(tmp_path / "align.gguf")
    _rejects(
        p,
        E.LimitExceeded,
        f"{p}: general.alignment is 2147483648: it must be a power of two no larger than 1048576; {DAMAGED}",
    )


def test_string_length_beyond_the_file(tmp_path, craft):
    raw = bytearray(craft.to_bytes())
    what, at, _ = next(f for f in craft.fields if f[0] == "value of general.name length")
    raw[at : at + 8] = struct.pack("<Q", 2**60)
    p = tmp_path / "len.gguf"
    p.write_bytes(bytes(raw))
    _rejects(
        p,
        E.LimitExceeded,
        f"{p}: the string value of general.name has length {2**60} (at byte {at}), more than the file holds; {DAMAGED}",
    )


# -- metadata types, duplicates, missing keys --------------------------------------------------------
def test_string_where_a_count_belongs(tmp_path, craft):
    craft.set("llama.block_count", "2", STRING)
    p = craft.write(tmp_path / "s.gguf")
    _rejects(
        p,
        E.WrongMetadataType,
        f"{p}: metadata key llama.block_count is declared string where the GGUF spec has uint32 or uint64; {DAMAGED}",
    )


def test_float_block_count(tmp_path, craft):
    craft.set("llama.block_count", 0.5, F32)
    p = craft.write(tmp_path / "f.gguf")
    _rejects(
        p,
        E.WrongMetadataType,
        f"{p}: metadata key llama.block_count is declared float32 where the GGUF spec has uint32 or uint64; {DAMAGED}",
    )


def test_chat_template_of_the_wrong_type(tmp_path, craft):
    craft.set("tokenizer.chat_template", ["a", "b"], ARRAY, STRING)
    p = craft.write(tmp_path / "t.gguf")
    _rejects(
        p,
        E.WrongMetadataType,
        f"{p}: metadata key tokenizer.chat_template is declared array of string where "
        f"the GGUF spec has string; {DAMAGED}",
    )


@pytest.mark.parametrize(
    "key, value, vtype, etype, declared, spec",
    [
        ("general.alignment", 32, U64, None, "uint64", "uint32"),  # llama.cpp reads it as uint32 only
        ("general.alignment", 32, U8, None, "uint8", "uint32"),
        ("tokenizer.ggml.token_type", None, ARRAY, U8, "array of uint8", "array of int32"),
        ("tokenizer.ggml.scores", None, ARRAY, F64, "array of float64", "array of float32"),
        ("tokenizer.ggml.eos_token_id", 0, I32, None, "int32", "uint32"),
        ("llama.rope.freq_base", 10000.0, F64, None, "float64", "float32"),
        ("tokenizer.ggml.add_bos_token", 1, U8, None, "uint8", "bool"),
    ],
)
def test_spec_key_declared_with_another_type(tmp_path, craft, key, value, vtype, etype, declared, spec):
    if value is None:  # an array, one entry per token
        value = [1 if etype == U8 else 0.0] * len(craft.kv("tokenizer.ggml.tokens").value)
    craft.set(key, value, vtype, etype)
    p = craft.write(tmp_path / "typed.gguf")
    _rejects(
        p,
        E.WrongMetadataType,
        f"{p}: metadata key {key} is declared {declared} where the GGUF spec has {spec}; {DAMAGED}",
    )


def test_counts_as_uint64_as_the_spec_writes_them_are_accepted(tmp_path, craft):
    for key in ("llama.block_count", "llama.context_length", "llama.embedding_length"):
        craft.set(key, int(craft.kv(key).value), U64)
    model = open_model(craft.write(tmp_path / "u64.gguf"))
    assert model.config.n_layers == int(craft.kv("llama.block_count").value)


def test_duplicate_chat_template_key(tmp_path, craft):
    craft.set("tokenizer.chat_template", "{{ 'first' }}", STRING)
    craft.kvs.append(copy.deepcopy(craft.kv("tokenizer.chat_template")))
    craft.kvs[-1].value = "{{ 'second' }}"
    p = craft.write(tmp_path / "dup.gguf")
    at = [f for f in craft.fields if f[0] == "key tokenizer.chat_template length"][1][1]
    _rejects(
        p,
        E.DuplicateEntry,
        f"{p}: metadata key tokenizer.chat_template appears twice (again at byte {at}); {E.DuplicateEntry.fix}",
    )


def test_models_inspect_reports_a_duplicate_key_not_its_second_value(tmp_path, craft):
    craft.kvs.append(copy.deepcopy(craft.kv("general.name")))
    craft.kvs[-1].value = "second-value"
    p = craft.write(tmp_path / "dup.gguf")
    r = _cli("models", "inspect", str(p))
    assert r.returncode == 2 and "second-value" not in r.stdout
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(
        f"opscope: error: {p}: metadata key general.name appears twice"
    )


def test_duplicate_tensor_name(tmp_path, craft):
    craft.tensor("blk.1.attn_q.weight").name = "blk.0.attn_q.weight"
    p = craft.write(tmp_path / "dup.gguf")
    _rejects(
        p,
        E.DuplicateEntry,
        f"{p}: tensor blk.0.attn_q.weight is listed twice in the tensor table; {E.DuplicateEntry.fix}",
    )


def test_missing_required_key(tmp_path, craft):
    p = craft.drop("llama.embedding_length").write(tmp_path / "m.gguf")
    _rejects(
        p,
        E.MissingMetadata,
        f"{p}: metadata key llama.embedding_length, which the llama architecture needs, "
        f"is missing; {E.MissingMetadata.fix}",
    )


# -- hyperparameters ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "key, value, detail",
    [
        ("llama.attention.head_count", 0, "llama.attention.head_count is 0: it must be an integer from 1 to 16777216"),
        ("llama.attention.head_count", 3, "3 heads do not divide the width 64 (and no head dim is given)"),
        ("llama.attention.head_count_kv", 3, "3 kv heads do not divide the 4 query heads"),
        ("llama.context_length", 0, "llama.context_length is 0: it must be an integer from 1 to 16777216"),
    ],
)
def test_impossible_hyperparameters_name_the_file(tmp_path, craft, key, value, detail):
    p = craft.set(key, value).write(tmp_path / "h.gguf")
    _rejects(p, E.InvalidHyperparameters, f"{p}: {detail}; {E.InvalidHyperparameters.fix}")


def test_head_count_zero_is_one_line_through_the_cli(tmp_path, craft):
    p = craft.set("llama.attention.head_count", 0).write(tmp_path / "h0.gguf")
    r = _cli("generate", "hi", "--model", str(p), "--max-tokens", "1")
    assert r.returncode == 2 and r.stderr == (
        f"opscope: error: {p}: llama.attention.head_count is 0: it must be an "
        f"integer from 1 to 16777216; {E.InvalidHyperparameters.fix}\n"
    )


def test_vocabulary_larger_than_the_embedding(tmp_path, craft):
    craft.kv("tokenizer.ggml.tokens").value.append("extra")
    craft.kv("tokenizer.ggml.token_type").value.append(1)
    p = craft.write(tmp_path / "v.gguf")
    _rejects(
        p,
        E.InvalidHyperparameters,
        f"{p}: tokenizer.ggml.tokens holds 321 tokens but the model has 320 "
        f"embedding rows (vocab_size); {E.InvalidHyperparameters.fix}",
    )


def test_impossible_hyperparameters_in_config_json(hf_dir):
    cfg = json.loads((hf_dir / "config.json").read_text())
    cfg["num_attention_heads"] = 0
    (hf_dir / "config.json").write_text(json.dumps(cfg))
    _rejects(
        hf_dir,
        E.InvalidHyperparameters,
        f"{hf_dir / 'config.json'}: num_attention_heads is 0: it must be an "
        f"integer from 1 to 16777216; {E.InvalidHyperparameters.fix}",
    )


def test_per_layer_head_counts_are_refused_in_one_line(tmp_path, craft):
    craft.set("llama.attention.head_count", [4, 4], ARRAY, 5)  # int32 elements
    p = craft.write(tmp_path / "perlayer.gguf")
    with pytest.raises(E.UnsupportedModelError) as info:
        open_model(p)
    assert str(info.value) == (
        f"{p}: metadata key llama.attention.head_count gives one value per layer; this engine "
        f"runs models whose layers all have the same sizes"
    )


def test_special_token_outside_the_vocabulary(tmp_path, craft):
    p = craft.set("tokenizer.ggml.bos_token_id", 320).write(tmp_path / "bos.gguf")
    _rejects(
        p,
        E.InvalidHyperparameters,
        f"{p}: metadata key tokenizer.ggml.bos_token_id is 320, outside the "
        f"vocabulary of 320 tokens; {E.InvalidHyperparameters.fix}",
    )


# -- the tensor table --------------------------------------------------------------------------------
def test_tensor_offset_past_the_end(tmp_path, craft):
    craft.tensor("blk.0.attn_q.weight").offset = 1 << 40
    p = craft.write(tmp_path / "oob.gguf")
    _rejects(
        p,
        E.TensorOutOfBounds,
        f"{p}: tensor blk.0.attn_q.weight spans data offsets {1 << 40}..{(1 << 40) + 4352}, "
        f"past the end of the data section (123136 bytes); {DAMAGED}",
    )


def test_misaligned_tensor_offset(tmp_path, craft):
    craft.tensor("blk.0.attn_q.weight").offset += 4
    p = craft.write(tmp_path / "mis.gguf")
    _rejects(
        p,
        E.TensorMisaligned,
        f"{p}: tensor blk.0.attn_q.weight starts at data offset 22020, not a multiple "
        f"of the file's alignment 32; {DAMAGED}",
    )


def test_aliasing_tensors(tmp_path, craft):
    craft.tensor("blk.1.attn_q.weight").offset = craft.tensor("blk.0.attn_q.weight").offset
    p = craft.write(tmp_path / "alias.gguf")
    _rejects(
        p,
        E.TensorOverlap,
        f"{p}: tensor blk.1.attn_q.weight (data offset 22016) aliases (starts at the same "
        f"offset as) tensor blk.0.attn_q.weight (data offsets 22016..26368): two tensors "
        f"would share bytes; {DAMAGED}",
    )


def test_overlapping_tensors(tmp_path, craft):
    craft.tensor("blk.0.attn_k.weight").offset -= 32
    p = craft.write(tmp_path / "overlap.gguf")
    _rejects(
        p,
        E.TensorOverlap,
        f"{p}: tensor blk.0.attn_k.weight (data offset 26336) overlaps tensor "
        f"blk.0.attn_q.weight (data offsets 22016..26368): two tensors would share bytes; "
        f"{DAMAGED}",
    )


def test_tensor_missing_from_the_table(tmp_path, craft):
    craft.tensor("blk.1.attn_q.weight").name = "blk.1.attn_x.weight"
    p = craft.write(tmp_path / "missing.gguf")
    _rejects(
        p,
        E.MissingTensor,
        f"{p}: tensor blk.1.attn_q.weight is missing (the model has 2 blocks); {E.MissingTensor.fix}",
    )


def test_vocabulary_only_file_opens_for_its_tokenizer_and_refuses_to_load(tmp_path, craft):
    craft.tensors, craft.data = [], b""
    p = craft.write(tmp_path / "vocab.gguf")
    assert open_model(p).tokenizer.encode("hi")
    r = _cli("generate", "hi", "--model", str(p), "--max-tokens", "1")  # the fast path: a KeyError before
    assert r.returncode == 2 and r.stderr == (
        f"opscope: error: {p}: holds no tensor for the llama model's "
        f"embed.weight (a vocabulary-only file, or tensors left out); "
        f"{E.MissingTensor.fix}\n"
    )


def test_tensor_shape_that_contradicts_the_head_counts(tmp_path, craft):
    craft.set("llama.attention.head_count_kv", 4)
    p = craft.write(tmp_path / "shape.gguf")
    _rejects(
        p,
        E.InvalidHyperparameters,
        f"{p}: tensor blk.0.attn_k.weight has shape (64, 32) (ggml order) but the "
        f"metadata's sizes imply (64, 64); {E.InvalidHyperparameters.fix}",
    )


# -- pickle weights ----------------------------------------------------------------------------------
def test_pickle_weights_are_refused_with_the_reason(tmp_path):
    d = tmp_path / "hf"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (d / "pytorch_model.bin").write_bytes(pickle.dumps({"w": [1.0]}, protocol=4))
    _rejects(
        d,
        E.UnsafeFormat,
        f"{d / 'pytorch_model.bin'}: holds pickle weights (PyTorch .bin/.pt), which this "
        f"engine refuses to load; {E.UnsafeFormat.fix}",
    )
    _rejects(
        d / "pytorch_model.bin",
        E.UnsafeFormat,
        f"{d / 'pytorch_model.bin'}: holds pickle weights (PyTorch "
        f".bin/.pt), which this engine refuses to load; "
        f"{E.UnsafeFormat.fix}",
    )
    assert "arbitrary code" in E.UnsafeFormat.fix


# -- chat templates ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "template, detail",
    [
        ("{{ 'A' * 10**9 }}", "stopped: '*' would make a string or list of 1000000000 items, over the cap of 1048584"),
        ("{% for i in range(10**9) %}x{% endfor %}", "stopped: range() of 1000000000 items is over the cap of 100000"),
        (
            "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}",
            "stopped: it ran more than 1000000 operations",
        ),
        (
            "{% set ns = namespace(x='ab') %}{% for i in range(40) %}{% set ns.x = ns.x ~ ns.x %}{% endfor %}",
            "stopped: '~' would make a string or list of 2097152 items, over the cap of 1048584",
        ),
        (
            "{{ '%0999999999d' % 1 }}",
            "stopped: '%' formatting would make a string or list of 999999999 items, over the cap of 1048584",
        ),
        (
            "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}",
            "stopped: RecursionError: maximum recursion depth exceeded",
        ),
    ],
)
def test_runaway_chat_template_is_stopped(tmp_path, craft, template, detail):
    p = craft.set("tokenizer.chat_template", template, STRING).write(tmp_path / "t.gguf")
    tok = open_model(p).tokenizer
    with pytest.raises(E.UnsafeTemplate) as info:
        tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert str(info.value) == f"{p}: chat template tokenizer.chat_template: {detail}; {E.UnsafeTemplate.fix}"


def test_broken_chat_template_names_file_and_key(tmp_path, craft):
    p = craft.set("tokenizer.chat_template", "{% for %}", STRING).write(tmp_path / "t.gguf")
    with pytest.raises(E.ChatTemplateError) as info:
        open_model(p).tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    assert str(info.value) == (
        f"{p}: chat template tokenizer.chat_template: does not compile: Expected an "
        f"expression, got 'end of statement block'; {E.ChatTemplateError.fix}"
    )


def test_sane_template_still_renders(tmp_path, craft):
    t = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    p = craft.set("tokenizer.chat_template", t, STRING).write(tmp_path / "t.gguf")
    out = open_model(p).tokenizer.apply_chat_template([{"role": "user", "content": "x" * 2_000_000}])
    assert out == "<|im_start|>user\n" + "x" * 2_000_000 + "<|im_end|>\n<|im_start|>assistant\n"


# -- safetensors and Hugging Face directories --------------------------------------------------------
def _safetensors(path: Path, header: dict, data: bytes) -> Path:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


@pytest.fixture
def hf_dir(tmp_path, tiny):
    """A valid tiny HF directory (config.json, tokenizer, one safetensors file) beside a valid GGUF."""
    from opscope.engine.formats.hf_source import hf_name
    from opscope.engine.testing.gguf_writer import hf_config
    from safetensors.numpy import save_file

    src = open_model(tiny)
    d = tmp_path / "hf"
    d.mkdir()
    save_file({hf_name(n): np.ascontiguousarray(w) for n, w in src.iter_tensors()}, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps(hf_config("llama")))
    src.tokenizer.backend.save(str(d / "tokenizer.json"))
    (d / "other.gguf").write_bytes(tiny.read_bytes())
    return d


def test_safetensors_file_path_loads_that_file(hf_dir):
    src = open_model(hf_dir / "model.safetensors")
    assert src.format == "safetensors" and src.shards == [hf_dir / "model.safetensors"]


def test_corrupt_safetensors_file_never_falls_back_to_a_gguf_beside_it(hf_dir):
    p = hf_dir / "model.safetensors"
    p.write_bytes(p.read_bytes()[:-10])
    e = _rejects(
        p,
        E.Truncated,
        f"{p}: tensor model.norm.weight ends at data byte 460032 but the file holds 460022 "
        f"bytes of data; {E.Truncated.fix}",
    )
    assert "gguf" not in str(e)


def test_lone_safetensors_file_without_config(tmp_path):
    p = _safetensors(
        tmp_path / "w.safetensors", {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4
    )
    _rejects(
        p,
        E.MissingMetadata,
        f"{p}: w.safetensors has no config.json beside it — not a Hugging Face model; put "
        f"the model's config.json (and tokenizer files) in the same directory",
    )


@pytest.mark.parametrize(
    "header, data, cls, detail",
    [
        (
            {"a": {"dtype": "F33", "shape": [1], "data_offsets": [0, 4]}},
            4,
            E.WrongMetadataType,
            "tensor a has dtype 'F33'; known: BOOL, U8, I8, F8_E5M2, F8_E4M3, F8_E8M0, I16, U16, F16, BF16, I32, U32, F32, "
            "F64, I64, U64",
        ),
        (
            {"a": {"dtype": "F32", "shape": ["2"], "data_offsets": [0, 8]}},
            8,
            E.WrongMetadataType,
            "tensor a has shape ['2']; a shape is a list of at most 8 non-negative integers",
        ),
        (
            {
                "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
            },
            12,
            E.TensorOverlap,
            "tensor b (bytes 4..12) overlaps tensor a (bytes 0..8)",
        ),
        (
            {"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}},
            8,
            E.TensorOutOfBounds,
            "tensor a starts at byte 4, leaving a gap after byte 0; safetensors tensors must be contiguous",
        ),
        (
            {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}},
            8,
            E.TensorOutOfBounds,
            "tensor a spans bytes 0..8 (8 bytes) but F32 × (4,) needs 16",
        ),
    ],
)
def test_bad_safetensors_header(tmp_path, header, data, cls, detail):
    p = _safetensors(tmp_path / "w.safetensors", header, b"\0" * data)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    from opscope.engine.formats.safetensors_header import read_safetensors_header

    with pytest.raises(cls) as info:
        read_safetensors_header(p)
    assert str(info.value) == f"{p}: {detail}; {cls.fix}"


def test_duplicate_name_in_safetensors_header(tmp_path):
    raw = (
        b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "a": {"dtype": "F32", "shape": [1], '
        b'"data_offsets": [0, 4]}}'
    )
    p = tmp_path / "w.safetensors"
    p.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 4)
    from opscope.engine.formats.safetensors_header import read_safetensors_header

    with pytest.raises(E.DuplicateEntry, match=r"the JSON header names 'a' twice"):
        read_safetensors_header(p)


def test_config_number_given_as_a_string(hf_dir):
    cfg = json.loads((hf_dir / "config.json").read_text())
    cfg["num_attention_heads"] = "4"
    (hf_dir / "config.json").write_text(json.dumps(cfg))
    _rejects(
        hf_dir,
        E.WrongMetadataType,
        f"{hf_dir / 'config.json'}: field num_attention_heads is '4' (a JSON string); it must be an integer; {DAMAGED}",
    )


def test_shard_path_outside_the_directory(hf_dir):
    (hf_dir / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"x": "../../etc/passwd"}}))
    idx = hf_dir / "model.safetensors.index.json"
    _rejects(
        hf_dir,
        E.UnsafeFormat,
        f"{idx}: shard path '../../etc/passwd' in weight_map leaves the model "
        f"directory; shards must be files inside the model directory; fix the index",
    )


def test_errors_survive_the_worker_process_boundary(tmp_path):
    e = E.TensorOverlap(tmp_path / "m.gguf", "tensor a overlaps tensor b")
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is E.TensorOverlap and str(back) == str(e)


def test_float_power_in_a_template_renders(tmp_path, craft):
    """The '**' size check reads the base's bit length: a float base is measured by its integer part."""
    p = craft.set("tokenizer.chat_template", "{{ 2.5 ** 3 }}|{{ 1.5 ** 2 }}", STRING).write(tmp_path / "t.gguf")
    assert open_model(p).tokenizer.apply_chat_template([{"role": "user", "content": "hi"}]) == "15.625|2.25"
