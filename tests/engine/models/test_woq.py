"""Weight-only int8/int4 (engine.models.woq): the packed weights multiply like the dequantized ones,
the rounding stays within half a quantization step, and the model keeps its predictions.

Stated tolerances (default model, top-1 at every position of a chat prompt, vs float32):
int8 top-1 agreement >= 0.9; int4 >= 0.99 (groups of 32 = the Q4_1 GGUF's own blocks, so the
re-quantization is lossless but for rounding: benchmarks/precision.py measured mean KL 2e-11).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from opscope.engine.core.errors import ConfigError
from opscope.engine.models.config import ModelConfig
from opscope.engine.models.transformer import Transformer
from opscope.engine.models.woq import Int4Linear, Int8Linear, int4_group, quantize_weights

TINY = ModelConfig(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, hidden_dim=128, max_seq_len=128)


def linear(n: int, k: int, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    lin = nn.Linear(k, n, bias=False)
    nn.init.normal_(lin.weight, std=0.05)
    return lin


def test_int8_rounds_each_weight_within_half_a_step():
    lin = linear(96, 576)
    q = Int8Linear(lin)
    step = lin.weight.abs().amax(1, keepdim=True) / 127
    assert q.weight.dtype == torch.int8 and q.weight.abs().max() <= 127
    assert ((q.dequantized() - lin.weight).abs() <= step / 2 + 1e-7).all()
    x = torch.randn(3, 576)
    torch.testing.assert_close(q(x), F.linear(x, q.dequantized()), rtol=1e-5, atol=1e-5)


def group_reference(w: torch.Tensor, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Independent float64 model of asymmetric 4-bit groups: (dequantized weight, step per weight)."""
    wg = w.double().reshape(-1, group)
    lo, hi = wg.amin(1, keepdim=True), wg.amax(1, keepdim=True)
    step = (hi - lo) / 15
    q = ((wg - lo) / step).round().clamp(0, 15)
    return (q * step + lo).reshape(w.shape), step.expand_as(wg).reshape(w.shape)


@pytest.mark.parametrize("n,k", [(576, 576), (192, 576), (576, 1536), (64, 128)])
def test_int4_matches_group_quantization_through_torch_kernel(n, k):
    lin = linear(n, k, seed=n + k)
    group = int4_group(k, n)
    q = Int4Linear(lin, group)
    deq, step = group_reference(lin.weight.detach(), group)
    assert ((deq - lin.weight.double()).abs() <= step / 2 + 1e-6).all()
    x = torch.randn(5, k)
    want = x.double() @ deq.T
    got = q(x).double()
    assert (got - want).abs().max().item() <= 1e-4 * (x.double().abs() @ deq.abs().T).max().item()
    assert q(x[None]).shape == (1, 5, n)  # leading dims kept


def test_int4_group_choice_and_unsupported_shapes():
    assert int4_group(576, 576) == 32 and int4_group(4096, 4096) == 32
    assert int4_group(576, 10) is None  # rows not a multiple of 8
    assert int4_group(40, 64) is None  # K not a multiple of 32


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_quantize_model_replaces_layer_linears_and_keeps_predictions(mode):
    ref = Transformer.random(TINY, seed=1)
    model = Transformer.random(TINY, seed=1)
    quantize_weights(model, mode)
    kind = Int8Linear if mode == "int8" else Int4Linear
    assert isinstance(model.layers[0].attn.q_proj, kind) and isinstance(model.layers[1].mlp.down_proj, kind)
    assert isinstance(model.lm_head, nn.Linear)  # the head stays dense
    idx = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        a, b = ref(idx, 0), model(idx, 0)
    rel = ((a - b).norm() / a.norm()).item()
    assert rel < (0.01 if mode == "int8" else 0.1), rel


def test_bad_mode_and_fast_path_conflict():
    from opscope.engine.api import load

    with pytest.raises(ConfigError, match="--quantize"):
        quantize_weights(Transformer.random(TINY), "int3")
    with pytest.raises(ConfigError, match="quantize='fp8'"):
        load(quantize="fp8")
    with pytest.raises(ConfigError, match="fastpath='off'"):
        load(quantize="int8", fastpath="activations=q8")


@pytest.mark.slow
@pytest.mark.parametrize("mode,floor", [("int8", 0.9), ("int4", 0.99)])
def test_default_model_agreement(mode, floor, lm_plain):
    from opscope.engine.api import load

    ref = lm_plain
    ref.model.drop_cache()  # as freshly loaded: a full forward without a KV cache, like lm's below
    lm = load(quantize=mode)
    assert lm.options.quantize == mode and lm.options.fastpath == "off"
    prompt = ref.tokenizer.apply_chat_template([{"role": "user", "content": "Write a short poem about the sea."}])
    ids = ref.tokenizer.encode(prompt, add_special_tokens=False)
    with torch.inference_mode():
        want = ref.model(torch.tensor([ids]), 0)[0]
        got = lm.model(torch.tensor([ids]), 0)[0]
    agreement = (want.argmax(-1) == got.argmax(-1)).float().mean().item()
    assert agreement >= floor, f"{mode}: top-1 agreement {agreement:.3f} < {floor}"
