"""A Hugging Face directory's safetensors headers against its config.json, before any shard is mapped.

Each malformed directory is generated here and differs from a valid one in one defect. The byte
spans are always consistent with the header's shapes (the safetensors library would accept every
file): what is wrong is the shape config.json implies, a missing tensor, a layer too many. Each is
refused by ``open_model`` (which reads headers only; shards are mapped later, by the loader) in one
line naming the shard, the tensor and what to do. The valid directory of every family loads through
the engine's own loader, so the checks are not stricter than the model.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from opscope.engine.core import errors as E
from opscope.engine.formats.hf_source import HFDirSource
from opscope.engine.testing.gguf_writer import FAMILIES, hf_config, random_tensors
from safetensors.numpy import save_file

DISAGREE = (
    "config.json and the weights disagree: use the config.json that came with these weights, or download "
    "the model again"
)
MISSING = "the weights are incomplete: download every shard again, or convert the model again"


def _write(d: Path, cfg: dict, tensors: dict[str, np.ndarray], shards: int = 1) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    names = list(tensors)
    if shards == 1:
        save_file(tensors, str(d / "model.safetensors"))
        return d
    weight_map = {}
    for k in range(shards):
        part = names[k::shards]
        file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        save_file({n: tensors[n] for n in part}, str(d / file))
        weight_map.update({n: file for n in part})
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return d


def _valid(family: str = "llama") -> tuple[dict, dict[str, np.ndarray]]:
    cfg = hf_config(family)
    return cfg, {n: make() for n, make in random_tensors(cfg).items()}


def _rejects(d: Path, cls, message: str) -> None:
    with pytest.raises(cls) as info:
        HFDirSource(d)
    assert str(info.value) == message
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_valid_directory_of_every_family_passes_and_loads(tmp_path, family):
    import torch
    from opscope.engine.models.loader import build_model

    cfg, tensors = _valid(family)
    src = HFDirSource(_write(tmp_path / family, cfg, tensors))
    model = build_model(src, torch.device("cpu"), torch.float32)
    assert sum(p.numel() for p in model.parameters()) > 0


def test_projection_rows_disagree_with_the_head_count(tmp_path):
    cfg, t = _valid()
    t["model.layers.1.self_attn.k_proj.weight"] = np.zeros((48, 64), np.float32)  # 2 kv heads × 16 = 32 rows
    d = _write(tmp_path / "m", cfg, t)
    _rejects(
        d,
        E.InvalidHyperparameters,
        f"{d / 'model.safetensors'}: tensor model.layers.1.self_attn.k_proj.weight "
        f"has shape [48, 64] but config.json's sizes imply [32, 64]; {DISAGREE}",
    )


def test_embedding_rows_disagree_with_vocab_size(tmp_path):
    cfg, t = _valid()
    del t["lm_head.weight"]
    d = _write(tmp_path / "m", {**cfg, "vocab_size": 512, "tie_word_embeddings": True}, t)
    _rejects(
        d,
        E.InvalidHyperparameters,
        f"{d / 'model.safetensors'}: tensor model.embed_tokens.weight has shape "
        f"[320, 64] but config.json's sizes imply [512, 64]; {DISAGREE}",
    )


def test_norm_of_the_wrong_width(tmp_path):
    cfg, t = _valid("qwen3")
    t["model.layers.0.self_attn.q_norm.weight"] = np.ones(64, np.float32)  # head_dim is 32
    d = _write(tmp_path / "m", cfg, t)
    _rejects(
        d,
        E.InvalidHyperparameters,
        f"{d / 'model.safetensors'}: tensor model.layers.0.self_attn.q_norm.weight "
        f"has shape [64] but config.json's sizes imply [32]; {DISAGREE}",
    )


def test_fused_projection_of_the_wrong_size(tmp_path):
    cfg, t = _valid("phi3")
    t["model.layers.0.mlp.gate_up_proj.weight"] = np.zeros((128, 64), np.float32)  # gate|up: 2 × 128 rows
    d = _write(tmp_path / "m", cfg, t)
    _rejects(
        d,
        E.InvalidHyperparameters,
        f"{d / 'model.safetensors'}: tensor model.layers.0.mlp.gate_up_proj.weight "
        f"has shape [128, 64] but config.json's sizes imply [256, 64]; {DISAGREE}",
    )


def test_layer_beyond_num_hidden_layers(tmp_path):
    cfg, t = _valid()
    t["model.layers.2.input_layernorm.weight"] = np.ones(64, np.float32)
    d = _write(tmp_path / "m", cfg, t)
    _rejects(
        d,
        E.InvalidHyperparameters,
        f"{d / 'model.safetensors'}: tensor model.layers.2.input_layernorm.weight "
        f"lies beyond the 2 layers that config.json's num_hidden_layers declares; "
        f"{DISAGREE}",
    )


def test_missing_tensor(tmp_path):
    cfg, t = _valid()
    del t["model.layers.1.mlp.down_proj.weight"], t["lm_head.weight"]
    d = _write(tmp_path / "m", cfg, t)
    _rejects(
        d, E.MissingTensor, f"{d}: tensor lm_head.weight (and 1 more) is in no safetensors file of the model; {MISSING}"
    )


def test_missing_qkv_bias_where_the_family_has_one(tmp_path):
    cfg, t = _valid("qwen2")
    del t["model.layers.0.self_attn.v_proj.bias"]
    d = _write(tmp_path / "m", cfg, t)
    _rejects(
        d,
        E.MissingTensor,
        f"{d}: tensor model.layers.0.self_attn.v_proj.bias is in no safetensors file of the model; {MISSING}",
    )


def test_the_shard_holding_the_bad_tensor_is_named(tmp_path):
    cfg, t = _valid()
    t["model.layers.0.mlp.up_proj.weight"] = np.zeros((128, 32), np.float32)
    d = _write(tmp_path / "m", cfg, t, shards=3)
    index = json.loads((d / "model.safetensors.index.json").read_text())["weight_map"]
    shard = d / index["model.layers.0.mlp.up_proj.weight"]
    _rejects(
        d,
        E.InvalidHyperparameters,
        f"{shard}: tensor model.layers.0.mlp.up_proj.weight has shape [128, 32] but "
        f"config.json's sizes imply [128, 64]; {DISAGREE}",
    )


def test_header_shape_against_its_byte_span(tmp_path):
    """A header whose shape does not match its bytes (the data moved to another tensor's span is
    still contiguous): refused by the header reader, naming the file and the tensor."""
    cfg, t = _valid()
    d = _write(tmp_path / "m", cfg, t)
    f = d / "model.safetensors"
    raw = f.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    header["model.norm.weight"]["shape"] = [65]
    new = json.dumps(header).encode()
    f.write_bytes(len(new).to_bytes(8, "little") + new + raw[8 + n :])
    begin, end = header["model.norm.weight"]["data_offsets"]
    _rejects(
        d,
        E.TensorOutOfBounds,
        f"{f}: tensor model.norm.weight spans bytes {begin}..{end} (256 bytes) but F32 × "
        f"(65,) needs 260; the file is damaged or was not written by a GGUF/safetensors "
        f"converter; download or convert it again",
    )


def test_cli_prints_one_line_and_exits_2(tmp_path):
    cfg, t = _valid()
    t["model.layers.0.self_attn.o_proj.weight"] = np.zeros((64, 32), np.float32)
    d = _write(tmp_path / "m", cfg, t)
    r = subprocess.run(
        [sys.executable, "-m", "opscope.engine.cli.main", "models", "inspect", str(d)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr == (
        f"opscope: error: {d / 'model.safetensors'}: tensor model.layers.0.self_attn.o_proj.weight "
        f"has shape [64, 32] but config.json's sizes imply [64, 64]; {DISAGREE}\n"
    )


def test_inspect_describes_a_lone_safetensors_file_then_says_why_it_cannot_run(tmp_path, capsys):
    from opscope.engine.cli.main import main

    _, tensors = _valid("llama")
    tensors["lm_head.weight"] = tensors["lm_head.weight"].astype(np.float16)
    lone = tmp_path / "lone.safetensors"
    save_file(tensors, str(lone), metadata={"format": "pt"})
    why = (
        f"{lone}: lone.safetensors has no config.json beside it — not a Hugging Face model; put the model's "
        f"config.json (and tokenizer files) in the same directory"
    )
    assert main(["models", "inspect", str(lone)]) == 0
    out = capsys.readouterr().out.splitlines()
    fields = {ln.split()[0]: ln.split()[1:] for ln in out if not ln.startswith(" ")}
    assert fields["format"] == ["safetensors"] and fields["tensors"] == [str(len(tensors))]
    assert fields["parameters"] == [str(sum(t.size for t in tensors.values()))]
    assert fields["tensor_bytes"] == [str(sum(t.nbytes for t in tensors.values()))]
    assert fields["file_size_bytes"] == [str(lone.stat().st_size)]
    assert " ".join(fields["tensor_types"]) == f"F32 ×{len(tensors) - 1}, F16 ×1"
    assert ["format", "pt"] in [ln.split() for ln in out[out.index("metadata:") : out.index("tensors:")]]
    shape = list(tensors["model.embed_tokens.weight"].shape)
    assert f"F32 {shape}".split() == next(ln.split()[1:] for ln in out if ln.split()[0] == "model.embed_tokens.weight")
    assert out[-1].split(None, 1) == ["runnable", f"no: {why}"]  # what it holds first, then why it cannot run
    assert main(["generate", "hi", "--model", str(lone)]) == 2  # generate keeps its one-line refusal
    assert capsys.readouterr().err.strip() == f"opscope: error: {why}"
