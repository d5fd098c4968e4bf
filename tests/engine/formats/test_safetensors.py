"""A Hugging Face directory written from the GGUF's tensors (HF layout, sharded) loads and gives
the same logits; transformers itself accepts the directory, so the layout really is HF's."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory, default_model_path):
    from opscope.engine.formats import open_model
    from opscope.engine.formats.hf_source import hf_name
    from safetensors.numpy import save_file

    src = open_model(default_model_path)
    cfg = src.config
    out = tmp_path_factory.mktemp("hf")
    tensors = {hf_name(n): np.ascontiguousarray(w) for n, w in src.iter_tensors()}
    names = sorted(tensors)
    shards = {
        "model-00001-of-00002.safetensors": names[: len(names) // 2],
        "model-00002-of-00002.safetensors": names[len(names) // 2 :],
    }
    for fname, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(out / fname))
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": {k: f for f, ks in shards.items() for k in ks}})
    )
    (out / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "hidden_size": cfg.dim,
                "num_hidden_layers": cfg.n_layers,
                "num_attention_heads": cfg.n_heads,
                "num_key_value_heads": cfg.n_kv_heads,
                "intermediate_size": cfg.hidden_dim,
                "vocab_size": cfg.vocab_size,
                "rms_norm_eps": cfg.norm_eps,
                "rope_theta": cfg.rope_theta,
                "max_position_embeddings": cfg.max_seq_len,
                "tie_word_embeddings": True,
                "bos_token_id": 1,
                "eos_token_id": 2,
                "torch_dtype": "float32",
            }
        )
    )
    src.tokenizer.backend.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": "<|im_start|>",
                "eos_token": "<|im_end|>",
                "add_bos_token": False,
                "chat_template": src.chat_template,
                "tokenizer_class": "PreTrainedTokenizerFast",
            }
        )
    )
    return out


def test_hf_directory_gives_same_logits(lm, hf_dir):
    from opscope.engine.api import load

    other = load(hf_dir)
    assert other.source.format == "safetensors"
    ids = lm.tokenizer.encode("Safetensors and GGUF agree on")
    assert other.tokenizer.encode("Safetensors and GGUF agree on") == ids
    # the same weights: the GGUF's quantized GEMM (panels through MKL's packed sgemm) and the dense
    # matmul sum in another order, so equal to float32 rounding through 30 layers (1e-5 of the
    # largest logit: ~40 float32 ulps at its size), not bit for bit
    mine, theirs = other.logits(ids), lm.logits(ids)
    torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-5 * float(theirs.abs().max()))
    assert torch.equal(mine.argmax(-1), theirs.argmax(-1))
    assert other.tokenizer.apply_chat_template([{"role": "user", "content": "x"}]) == lm.tokenizer.apply_chat_template(
        [{"role": "user", "content": "x"}]
    )


def test_transformers_reads_the_same_directory(lm, hf_dir):
    transformers = pytest.importorskip("transformers")
    ref = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    ids = lm.tokenizer.encode("Independent check of the layout")
    with torch.no_grad():
        expected = ref(torch.tensor([ids])).logits[0]
    assert (lm.logits(ids) - expected).abs().max().item() < 1e-3


def test_missing_shard_is_a_clear_error(hf_dir, tmp_path):
    import shutil

    from opscope.engine.core.errors import ModelFormatError
    from opscope.engine.formats import open_model

    broken = tmp_path / "broken"
    shutil.copytree(hf_dir, broken)
    (broken / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ModelFormatError, match="missing"):
        open_model(broken)
