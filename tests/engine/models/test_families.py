"""Contract tests over every architecture family (mlx-lm's model_test_runner idea).

Per family a tiny random model is written as a GGUF by engine.testing.gguf_writer (llama.cpp's
names, keys and conventions) and loaded twice: by OpScope and by Hugging Face transformers (which
dequantizes to float32). Last-position logits must agree within 1e-3 and 16 greedy tokens must be
equal, on the plain torch path, the fast path (linears written Q8_0, so the quantized kernels run
on the same blocks transformers dequantizes) and a compiled decode step. Prompts are longer than
the sliding window, and prefill runs in chunks, so windows are exercised (checked below: the
reference itself changes without them).

transformers' GGUF loader leaves a few fields at its config defaults (they are not in the file):
the test passes the values llama.cpp derives from the same file (``HF_KWARGS``). transformers
cannot load a llama-arch GGUF as Mistral in this version (gguf-py has no "mistral" arch), so the
Mistral reference is transformers' MistralForCausalLM holding the Llama-loaded weights.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from opscope.engine.testing.gguf_writer import hf_config, random_tensors, write_gguf  # noqa: E402

WINDOW = 16
PROMPT_LEN = 40  # > WINDOW: the windowed layers drop keys during prefill and decode
GREEDY = 16


@dataclass(frozen=True)
class Case:
    cfg: dict
    std: float = 0.02
    hf_kwargs: tuple[str, ...] = ()  # config fields transformers' GGUF loader does not read
    sensitive: dict = field(default_factory=dict)  # reference overrides that must change the logits


CASES = {
    "llama": Case(hf_config("llama", num_hidden_layers=3)),
    "mistral": Case(
        hf_config("mistral", sliding_window=WINDOW), hf_kwargs=("sliding_window",), sensitive={"sliding_window": None}
    ),
    "qwen2": Case(hf_config("qwen2")),
    "qwen3": Case(hf_config("qwen3"), hf_kwargs=("head_dim",)),
    # larger weights and small caps so that soft-capping changes the result
    "gemma2": Case(
        hf_config(
            "gemma2",
            num_hidden_layers=2,
            sliding_window=WINDOW,
            attn_logit_softcapping=1.0,
            final_logit_softcapping=2.0,
        ),
        std=0.1,
        hf_kwargs=("query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping"),
        sensitive={"attn_logit_softcapping": None, "final_logit_softcapping": None},
    ),
    # six layers: five local, one global (Gemma 3's pattern)
    "gemma3": Case(
        hf_config("gemma3", num_hidden_layers=6, sliding_window=WINDOW),
        std=0.05,
        hf_kwargs=("query_pre_attn_scalar",),
        sensitive={"sliding_window": 4096},
    ),
    "phi3": Case(hf_config("phi3")),
}


def _prompt(vocab: int) -> list[int]:
    return [int(i) for i in np.random.default_rng(7).integers(1, vocab, PROMPT_LEN)]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """(family, "F32"|"Q8_0") → GGUF path, written once per module."""
    root = tmp_path_factory.mktemp("families")
    made = {}

    def get(family: str, qtype: str):
        if (family, qtype) not in made:
            case = CASES[family]
            path = root / f"{family}-{qtype}.gguf"
            write_gguf(path, case.cfg, random_tensors(case.cfg, seed=1, std=case.std), types=qtype)
            made[family, qtype] = path
        return made[family, qtype]

    return get


def load_reference(path, family: str, **overrides):
    """transformers' model of the GGUF at ``path`` (float32, eval)."""
    from transformers import AutoModelForCausalLM

    case = CASES[family]
    kwargs = {k: case.cfg[k] for k in case.hf_kwargs} | overrides
    if family == "mistral":
        llama = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
        cfg = transformers.MistralConfig(**{**llama.config.to_dict(), "model_type": "mistral", **kwargs})
        model = transformers.MistralForCausalLM(cfg)
        model.load_state_dict(llama.state_dict())
        return model.eval()
    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32, **kwargs).eval()


@pytest.fixture(scope="module")
def references(files):
    cache = {}

    def get(family: str, qtype: str):
        if (family, qtype) not in cache:
            cache[family, qtype] = load_reference(files(family, qtype), family)
        return cache[family, qtype]

    return get


def ref_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()  # [T,V]


def ref_greedy(model, ids: list[int], n: int = GREEDY) -> list[int]:
    """Greedy tokens by full recomputation (no cache): the plainest reference."""
    out = list(ids)
    for _ in range(n):
        out.append(int(ref_logits(model, out)[-1].argmax()))
    return out[len(ids) :]


def our_greedy(lm, ids: list[int], n: int = GREEDY) -> list[int]:
    from opscope.engine.generation.events import Token
    from opscope.engine.generation.generate import GenerationConfig

    cfg = GenerationConfig(max_tokens=n, ignore_eos=True, prefill_chunk=12)  # chunked prefill: masks at start>0
    return [ev.token_id for ev in lm.generate(ids, cfg) if isinstance(ev, Token)]


def check_against_reference(lm, ref, family: str) -> float:
    ids = _prompt(CASES[family].cfg["vocab_size"])
    expected = ref_logits(ref, ids)
    got = lm.logits(ids)
    delta = float((got[-1] - expected[-1]).abs().max())
    assert delta < 1e-3, f"{family}: last-position logits differ by {delta:.2e}"
    torch.testing.assert_close(got, expected, atol=1e-3, rtol=0)
    assert our_greedy(lm, ids) == ref_greedy(ref, ids), f"{family}: greedy tokens differ"
    return delta


@pytest.mark.parametrize("family", list(CASES))
def test_eager_matches_transformers(family, files, references, one_torch_thread):
    from opscope.engine.api import load

    lm = load(str(files(family, "F32")), fastpath="off")
    # llama.cpp writes Mistral as a llama-arch file; its window comes from the metadata
    assert lm.config.arch == ("llama" if family == "mistral" else family)
    assert lm.config.sliding_window == (WINDOW if family == "mistral" else 0)
    check_against_reference(lm, references(family, "F32"), family)


@pytest.mark.parametrize("family", list(CASES))
def test_fastpath_matches_transformers(family, files, references, one_torch_thread):
    from opscope.engine.api import load
    from opscope.engine.fastpath.qlinear import QuantLinear

    lm = load(str(files(family, "Q8_0")), fastpath="auto")
    assert isinstance(lm.model.layers[0].attn.q_proj, QuantLinear)  # the quantized kernels run
    assert isinstance(lm.model.layers[0].mlp.gate_proj, QuantLinear)
    check_against_reference(lm, references(family, "Q8_0"), family)


class MLXLogits:
    """An MLX backend model seen through check_against_reference (torch logits out)."""

    def __init__(self, lm):
        self.lm = lm

    def logits(self, ids):
        return torch.from_numpy(self.lm.logits(ids))

    def generate(self, ids, cfg):
        return self.lm.generate(ids, cfg)


@pytest.mark.parametrize("qtype", ["F32", "Q8_0"])
@pytest.mark.parametrize("family", list(CASES))
def test_mlx_backend_matches_transformers(family, qtype, files, references, one_torch_thread):
    """The same contract on the MLX backend, built from the same family descriptors (Q8_0 blocks
    repacked exactly into MLX 8-bit groups, so the reference is the same dequantized weights)."""
    pytest.importorskip("mlx.core")
    import mlx.nn as nn
    from opscope.engine.backends import get_backend

    lm = get_backend("mlx").load(files(family, qtype))
    assert lm.config.arch == ("llama" if family == "mistral" else family)
    if qtype == "Q8_0":
        assert isinstance(lm.model.layers[0].attn.q_proj, nn.QuantizedLinear)
    check_against_reference(MLXLogits(lm), references(family, qtype), family)


@pytest.mark.parametrize("family", ["gemma2", "gemma3"])
def test_compiled_decode_matches_transformers(family, files, references, one_torch_thread):
    """Compiling is slow (20-40 s per family on a quiet 2-core CPU, minutes on a busy one): the two
    families whose step differs most from Llama's (soft-caps through the naive attention; windows,
    local RoPE, QK-norm, post-norms, GeGLU, scales). test_compiled_decode covers the Llama core."""
    from opscope.engine.api import load

    lm = load(str(files(family, "F32")), fastpath="off", compile="decode")
    check_against_reference(lm, references(family, "F32"), family)


@pytest.mark.parametrize("family", ["mistral", "gemma2", "gemma3"])
def test_static_decode_step_matches_transformers(family, files, references, one_torch_thread):
    """decode_static (the step CUDA graphs capture: the whole cache under a mask) applies windows,
    local RoPE and soft-caps as the forward does; run eagerly here, position by position."""
    from opscope.engine.api import load

    ref = references(family, "F32")
    ids = _prompt(CASES[family].cfg["vocab_size"])
    full = ids + ref_greedy(ref, ids)
    expected = ref_logits(ref, full)  # [T,V]
    model = load(str(files(family, "F32")), fastpath="off").model
    model.setup_cache(1, 64)
    with torch.inference_mode():
        model(torch.tensor([ids]), 0)
        for t in range(len(ids), len(full)):
            got = model.decode_static(torch.tensor([[full[t]]]), torch.tensor([t]))[0, -1]
            torch.testing.assert_close(got, expected[t], atol=1e-3, rtol=0)


@pytest.mark.parametrize("family", ["llama", "qwen2", "phi3"])
def test_fused_decode_runs_llama_core_families(family, files):
    """The fused C++ step runs plain Llama blocks only; families made of them keep it."""
    from opscope.engine.api import load

    lm = load(str(files(family, "Q8_0")), fastpath="auto")
    assert lm.model.decode_step is not None


@pytest.mark.parametrize("family", ["mistral", "qwen3", "gemma2", "gemma3"])
def test_fused_decode_refused_for_other_switches(family, files):
    from opscope.engine.api import load
    from opscope.engine.fastpath.decode import fusable

    lm = load(str(files(family, "Q8_0")), fastpath="auto")
    assert not fusable(lm.model)
    assert lm.model.decode_step is None  # the torch forward with quantized linears decodes


@pytest.mark.parametrize("family", [f for f in CASES if CASES[f].sensitive])
def test_switches_are_exercised(family, files, references):
    """The reference changes when the family's window / soft-caps are dropped, so the agreement
    above is evidence that OpScope applies them."""
    ids = _prompt(CASES[family].cfg["vocab_size"])
    plain = load_reference(files(family, "F32"), family, **CASES[family].sensitive)
    delta = float((ref_logits(plain, ids) - ref_logits(references(family, "F32"), ids)).abs().max())
    assert delta > 1e-2, f"{family}: {CASES[family].sensitive} changes the logits by only {delta:.1e}"


def save_hf_directory(ref, gguf_path, directory):
    """``ref`` saved with save_pretrained (a GGUF-loaded model counts as quantized and refuses: a
    plain copy is saved), plus a tokenizer.json (OpScope's tokenizer of the same GGUF)."""
    from opscope.engine.api import load

    cfg = ref.config.__class__.from_dict({k: v for k, v in ref.config.to_dict().items() if k != "quantization_config"})
    plain = type(ref)(cfg)
    plain.load_state_dict(ref.state_dict())
    plain.save_pretrained(directory)
    load(str(gguf_path), fastpath="off").tokenizer.backend.save(str(directory / "tokenizer.json"))


@pytest.mark.parametrize("family", ["mistral", "qwen3", "gemma2", "gemma3", "phi3"])
def test_hf_directory_matches_transformers(family, files, references, tmp_path, one_torch_thread):
    """A Hugging Face directory (config.json + safetensors: Gemma norms stored as w, Phi-3's fused
    qkv and gate_up), loaded by OpScope and by transformers itself."""
    from opscope.engine.api import load
    from transformers import AutoModelForCausalLM

    save_hf_directory(references(family, "F32"), files(family, "F32"), tmp_path)
    ref = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    lm = load(str(tmp_path), fastpath="off")
    assert lm.source.format == "safetensors" and lm.config.arch == family
    if family == "mistral":
        assert json.loads((tmp_path / "config.json").read_text())["sliding_window"] == WINDOW
        assert lm.config.sliding_window == WINDOW
    check_against_reference(lm, ref, family)


@pytest.fixture
def mamba_gguf(tmp_path):
    """A well-formed GGUF of an architecture OpScope does not run."""
    import gguf

    path = tmp_path / "mamba.gguf"
    w = gguf.GGUFWriter(str(path), "mamba")
    w.add_name("tiny mamba")
    w.add_block_count(1)
    w.add_token_list([f"t{i}" for i in range(40)])
    w.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_unknown_architecture_names_it_and_the_supported_list(mamba_gguf):
    from opscope.engine.core.errors import UnsupportedModelError
    from opscope.engine.formats import open_model

    with pytest.raises(UnsupportedModelError) as e:
        open_model(mamba_gguf)
    msg = str(e.value)
    assert "'mamba'" in msg and "gemma3" in msg and "phi3" in msg and "\n" not in msg


def test_inspect_prints_metadata_of_a_file_it_cannot_run(mamba_gguf, capsys):
    from opscope.engine.cli.main import main

    assert main(["models", "inspect", str(mamba_gguf)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert any(ln.split() == ["general.name", "tiny", "mamba"] for ln in out)
    assert any(ln.split()[:2] == ["mamba.block_count", "1"] for ln in out)
    assert any("tokenizer.ggml.tokens" in ln and "40 items" in ln for ln in out)  # long arrays shortened
    why = [ln for ln in out if ln.startswith("runnable")]
    assert len(why) == 1 and "no:" in why[0] and "architecture 'mamba' is not supported" in why[0]


def test_inspect_describes_a_family_model(files, capsys):
    from opscope.engine.cli.main import main

    assert main(["models", "inspect", str(files("gemma2", "Q8_0"))]) == 0
    out = capsys.readouterr().out
    assert ["runnable", "yes"] in [ln.split() for ln in out.splitlines()]
    assert "softcap attn 1 / logits 2" in out and "sliding window 16 on 1/2 layers" in out
    assert "gemma2.attn_logit_softcapping" in out


def test_writer_stores_llama_cpp_conventions(files):
    """Independent of OpScope's loaders: read the file back with gguf's own reader."""
    import gguf

    cfg = CASES["gemma2"].cfg
    tensors = random_tensors(cfg, seed=1, std=CASES["gemma2"].std)
    r = gguf.GGUFReader(files("gemma2", "F32"))
    assert r.fields["general.architecture"].contents() == "gemma2"
    assert r.fields["gemma2.attention.sliding_window"].contents() == WINDOW
    by_name = {t.name: t for t in r.tensors}
    assert "output.weight" not in by_name  # Gemma 2 ties its head
    norm = np.asarray(by_name["blk.0.attn_norm.weight"].data)
    np.testing.assert_allclose(norm, tensors["model.layers.0.input_layernorm.weight"]() + 1, rtol=0, atol=1e-6)


@pytest.mark.parametrize("family", ["qwen3", "gemma2", "gemma3", "phi3"])
def test_mlx_backend_reads_hf_directories_of_the_families(family, files, references, tmp_path, one_torch_thread):
    """Hugging Face directories on the MLX backend through the engine's own source (Gemma's w+1 norms,
    Phi-3's fused qkv and gate_up split by the family descriptors)."""
    pytest.importorskip("mlx.core")
    from opscope.engine.backends import get_backend
    from transformers import AutoModelForCausalLM

    save_hf_directory(references(family, "F32"), files(family, "F32"), tmp_path)
    ref = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    lm = get_backend("mlx").load(tmp_path)
    assert lm.source.format == "safetensors" and lm.config.arch == family
    check_against_reference(MLXLogits(lm), ref, family)
