"""Q4_0 held as Q4_1 (m = -8 d): the fused decode step takes the offset from d and never reads m.

The reference is the torch model with the blocks' weights dequantized by gguf.quants.dequantize
(the ggml project's decoder). The fused step's mins array is poisoned with NaN after it is built:
a kernel that still read m would return NaN logits, so the test can tell.
"""

from __future__ import annotations

import os

import gguf
import numpy as np
import pytest
import torch
from opscope.engine.fastpath.kernels.build import cache_root

os.environ.setdefault("OPSCOPE_KERNEL_CACHE", str(cache_root()))

from opscope.engine.fastpath import FastPathOptions, apply, linear_names
from opscope.engine.fastpath.kernels.packing import QTYPE_Q4_0_SOA, pack, random_blocks
from opscope.engine.fastpath.qlinear import QuantLinear
from opscope.engine.models.config import ModelConfig
from opscope.engine.models.transformer import Transformer

CFG = ModelConfig(
    dim=96, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=160, vocab_size=128, max_seq_len=32, tie_embeddings=True
)


class Q4_0Source:
    """Q4_0 linears (96 and 160 wide: 3 and 5 blocks, odd counts) and a Q8_0 tied embedding."""

    def __init__(self, model: Transformer):
        rng = np.random.default_rng(4)
        self.blocks = {}
        for name in linear_names(model)[:-1] + ["embed"]:
            n, k = model.get_submodule(name).weight.shape
            kind = "Q8_0" if name == "embed" else "Q4_0"
            self.blocks[f"{name}.weight"] = (kind, random_blocks(kind, n, k, rng), (n, k))

    def raw_tensor(self, name: str):
        return self.blocks[name]


def test_spec_marks_q4_0_in_the_q4_1_layout():
    raw = random_blocks("Q4_0", 5, 64, np.random.default_rng(0))
    w = pack("Q4_0", raw, (5, 64))
    assert w.m is not None and w.qtype == 0  # the ops read it as Q4_1
    assert w.spec()[0] == QTYPE_Q4_0_SOA  # the fused step skips m
    assert pack("Q4_0", raw, (5, 64), layout="raw").spec()[0] != QTYPE_Q4_0_SOA


@pytest.mark.parametrize("activations", ["f32", "q8"])
def test_fused_decode_never_reads_the_q4_0_mins(activations):
    ref = Transformer.random(CFG, seed=1)
    source = Q4_0Source(ref)
    with torch.no_grad():
        for name, (kind, raw, shape) in source.blocks.items():
            dense = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[kind]).reshape(shape)
            ref.get_submodule(name.removesuffix(".weight")).weight.copy_(torch.from_numpy(dense.astype(np.float32)))
    fast = Transformer.random(CFG, seed=1)
    fast.load_state_dict(ref.state_dict())
    apply(fast.eval(), source, FastPathOptions(prefill_dtype="f32", activations=activations))
    assert fast.decode_step is not None
    q4 = [m for m in fast.modules() if isinstance(m, QuantLinear) and m.ggml_type == "Q4_0"]
    assert len(q4) == 14 and all(m.m is not None for m in q4)
    want = decode(ref.eval(), [5, 17, 99, 3, 64])
    for m in q4:
        m.m.fill_(float("nan"))  # the tensor the fused step was built over
    got = decode(fast, [5, 17, 99, 3, 64])
    assert torch.isfinite(got).all()
    tol = 1e-4 if activations == "f32" else 5e-2  # q8: the int8 rounding of the activations
    assert (got - want).abs().max().item() <= tol * want.abs().max().item()


def decode(model, tokens: list[int]) -> torch.Tensor:
    """Logits of each token fed one by one from position 0 (single-token steps only: no prefill)."""
    model.setup_cache(1, len(tokens) + 1)
    with torch.inference_mode():
        return torch.stack([model(torch.tensor([[t]]), i)[0, -1] for i, t in enumerate(tokens)])
