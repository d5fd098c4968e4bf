"""Every GGUF type the torch backend reads loads on the MLX backend: Q4_0/Q4_1/Q8_0/Q4_K/Q5_0/Q5_1/Q5_K
repacked exactly, the others (Q2_K, Q3_K, Q6_K, IQ4_NL, IQ4_XS) requantized to MLX 8-bit groups,
floats dense; the conversion stated; the numbers checked against the file's own dequantized weights
and against the torch backend on the same file. Tiny files of every type come from
engine.testing.gguf_writer (random valid blocks for the types gguf-py cannot write); a real
llama-quantize'd file is used when the tool is there."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core")

from opscope.engine.backends import get_backend  # noqa: E402
from opscope.engine.formats.gguf_source import SUPPORTED_TYPES  # noqa: E402
from opscope.engine.testing.gguf_writer import hf_config, write_typed_gguf  # noqa: E402

WIDE = dict(
    hidden_size=256,
    intermediate_size=512,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=320,
    num_hidden_layers=2,
)
EXPECTED = {
    "F32": None,
    "F16": None,
    "BF16": None,
    "Q4_0": "Q4_0 → MLX 4-bit g32: exact",
    "Q4_1": "Q4_1 → MLX 4-bit g32: exact",
    "Q8_0": "Q8_0 → MLX 8-bit g32: exact",
    "Q4_K": "Q4_K → MLX 4-bit g32: exact",
    "Q5_0": "Q5_0 → MLX 8-bit g32: exact",
    "Q5_1": "Q5_1 → MLX 8-bit g32: exact",
    "Q5_K": "Q5_K → MLX 8-bit g32: exact",
    "Q2_K": "Q2_K → MLX 8-bit g32: requantized",
    "Q3_K": "Q3_K → MLX 8-bit g32: requantized",
    "Q6_K": "Q6_K → MLX 8-bit g32: requantized",
    "IQ4_NL": "IQ4_NL → MLX 8-bit g32: requantized",
    "IQ4_XS": "IQ4_XS → MLX 8-bit g32: requantized",
}


@pytest.fixture(scope="module")
def typed(tmp_path_factory):
    root, made = tmp_path_factory.mktemp("types"), {}

    def get(qtype: str) -> Path:
        if qtype not in made:
            made[qtype] = write_typed_gguf(root / f"llama-{qtype}.gguf", hf_config("llama", **WIDE), qtype, seed=3)
        return made[qtype]

    return get


def test_every_type_the_torch_backend_reads_is_covered():
    assert set(EXPECTED) == set(SUPPORTED_TYPES)


def file_weight(path: Path, name: str) -> np.ndarray:
    import gguf
    from opscope.engine import open_model

    kind, raw, shape = open_model(path).raw_tensor(name)
    return gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[kind]).reshape(shape)


def mlx_weight(module) -> np.ndarray:
    if not hasattr(module, "scales"):
        return np.array(module.weight.astype(mx.float32))
    w = mx.dequantize(module.weight, module.scales, module.biases, group_size=module.group_size, bits=module.bits)
    return np.array(w.astype(mx.float32))


@pytest.mark.parametrize("qtype", sorted(EXPECTED))
def test_type_loads_with_its_conversion_stated_and_bounded(qtype, typed):
    """MLX's weights against the file's own dequantized ones: exact for repacks and floats, within
    one quantization step of the group for requantized types (mx.quantize makes the group's larger
    edge exact and rounds the step to it, so its error reaches ~0.98 of a step, not half of one)."""
    lm = get_backend("mlx").load(typed(qtype))
    assert lm.describe().get("conversion") == EXPECTED[qtype]
    q = lm.model.layers[1].mlp.down_proj
    ref, got = file_weight(typed(qtype), "layers.1.mlp.down_proj.weight"), mlx_weight(q)
    err = np.abs(got - ref)
    if EXPECTED[qtype] is None or EXPECTED[qtype].endswith("exact"):
        assert err.max() <= 1e-6 * np.abs(ref).max()
    else:
        assert q.bits == int(EXPECTED[qtype].split("MLX ")[1][0])
        groups = ref.reshape(ref.shape[0], -1, q.group_size)
        step = (groups.max(-1) - groups.min(-1)) / (2**q.bits - 1)  # [rows, groups]
        assert (err.reshape(groups.shape) <= step[..., None]).all()


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_K", "Q5_K", "Q2_K", "Q6_K", "IQ4_XS"])
def test_logits_against_the_torch_backend_on_the_same_file(qtype, typed):
    from opscope.engine.api import load

    ids = [int(i) for i in np.random.default_rng(7).integers(1, 300, 40)]
    ref = load(typed(qtype), fastpath="off").logits(ids).numpy()
    got = get_backend("mlx").load(typed(qtype)).logits(ids)
    lr = ref - np.log(np.exp(ref - ref.max(-1, keepdims=True)).sum(-1, keepdims=True)) - ref.max(-1, keepdims=True)
    lg = got - np.log(np.exp(got - got.max(-1, keepdims=True)).sum(-1, keepdims=True)) - got.max(-1, keepdims=True)
    kl = (np.exp(lr) * (lr - lg)).sum(-1).mean()
    if EXPECTED[qtype].endswith("exact"):
        assert np.abs(ref - got).max() <= 1e-3
    else:
        assert kl < 0.05, f"{qtype}: mean KL {kl:.3g}"


LLAMA_QUANTIZE = Path(os.environ.get("OPSCOPE_LLAMA_QUANTIZE", "/work/shared/tools/llama.cpp/llama-quantize"))


@pytest.mark.slow
def test_real_q4_k_m_download_loads_and_greedy_matches_torch(tmp_path, lm):
    """The embedded model re-quantized by llama.cpp to Q4_K_M (a K-quant mix, as downloads are)."""
    tool = LLAMA_QUANTIZE if LLAMA_QUANTIZE.exists() else shutil.which("llama-quantize")
    if not tool:
        pytest.skip("llama-quantize is not available (set OPSCOPE_LLAMA_QUANTIZE)")
    from opscope.engine.api import load
    from opscope.engine.core.defaults import default_model_path
    from opscope.engine.generation.events import Token
    from opscope.engine.generation.generate import GenerationConfig

    out = tmp_path / "q4km.gguf"
    subprocess.run(
        [str(tool), "--allow-requantize", str(default_model_path()), str(out), "Q4_K_M", "2"],
        check=True,
        capture_output=True,
        env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"},
    )
    mlx_lm = get_backend("mlx").load(out)
    assert "Q4_K → MLX 4-bit g32: exact" in mlx_lm.describe()["conversion"]
    cfg = GenerationConfig(max_tokens=16, ignore_eos=True)
    ids = lm.tokenizer.encode("The capital of France is")
    greedy = [
        [e.token_id for e in m.generate(ids, cfg) if isinstance(e, Token)] for m in (load(out, fastpath="off"), mlx_lm)
    ]
    assert greedy[0] == greedy[1]


def test_models_inspect_states_the_mlx_conversion(typed, capsys):
    from opscope.engine.cli.main import main

    assert main(["models", "inspect", str(typed("Q6_K")), "--backend", "mlx"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert ["mlx_conversion", "Q6_K → MLX 8-bit g32: requantized"] in [line.split(None, 1) for line in lines]


def test_bench_llm_points_run_through_the_mlx_backend(typed):
    """bench llm on a plugin backend: pp and tg through the backend's own generate, the depth
    points skipped with the reason, the e2e request with its engine stats."""
    from opscope.engine.bench.measure.options import BenchOptions
    from opscope.engine.bench.measure.runner import PointSkipped
    from opscope.engine.bench.suites import llm

    lm = get_backend("mlx").load(typed("Q4_0"))
    plan = llm.plan(
        BenchOptions(backend="mlx"), llm.Params(pp=8, tg=4, depths=(0, 8), gen_prompt=8, gen_tokens=4), model=lm
    )
    assert plan.settings["weights_bytes_per_decode_step"] == lm.memory_stats()["weights_bytes"]
    points = list(plan.points)
    assert [p.name for p in points] == ["pp8", "tg4", "pp8@d8", "tg4@d8", "e2e_p8_g4"]
    for p in points[:2] + points[-1:]:
        stats = p.prepare()()
        assert stats.generated_tokens == (1 if p.name == "pp8" else 4)
    with pytest.raises(
        PointSkipped, match="^the mlx backend measures whole requests; depth points need --backend torch$"
    ):
        points[2].prepare()
