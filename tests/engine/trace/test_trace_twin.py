"""The plain torch twin a trace runs for a fast-path model: its size (the plain model's own weights),
refused with one line where memory cannot hold it, kept for the next trace only while it is small."""

from __future__ import annotations

import pytest
import torch
from opscope.engine import load
from opscope.engine.core.errors import InsufficientMemory
from opscope.engine.generation.generate import GenerationConfig
from opscope.engine.trace import session
from opscope.engine.trace.session import trace_generation, twin_weight_bytes

CONFIG = GenerationConfig(max_tokens=2, ignore_eos=True)


@pytest.fixture(scope="module")
def fast():
    lm = load(threads=1)  # the embedded model on the fast path
    assert lm.options.fastpath != "off"
    return lm


def test_the_twin_s_size_is_the_plain_model_s_weights(fast):
    plain = load(threads=1, fastpath="off")
    storages = {p.data_ptr(): p.numel() * p.element_size() for p in plain.model.parameters()}
    assert twin_weight_bytes(fast) == sum(storages.values())  # 538 MB: tied head and embedding once


def test_the_twin_is_the_plain_model_bit_for_bit_decoded_by_the_kernels(fast):
    from opscope.engine.fastpath.loader import plain_twin

    twin, plain = plain_twin(fast).model.state_dict(), load(threads=1, fastpath="off").model.state_dict()
    assert twin.keys() == plain.keys()
    assert [k for k in plain if not torch.equal(twin[k], plain[k])] == []  # plain: gguf's numpy decoders


def test_a_twin_memory_cannot_hold_is_refused_with_what_it_needs(fast, monkeypatch):
    fast._trace_twin = None
    monkeypatch.setattr(session, "TWIN_SLACK", 1e6)  # the real free memory, against a need it cannot meet
    with pytest.raises(InsufficientMemory) as e:
        trace_generation(fast, "Hello", CONFIG)
    assert str(e.value).startswith(
        "tracing SmolLM2-135M-Instruct.Q4_1.gguf runs its plain torch model beside the fast path: 513 MiB of "
        "float32 weights, ~489 TiB with its working memory, and "
    )
    assert str(e.value).endswith(" is free; trace a smaller model, or free memory first")
    assert fast._trace_twin is None


def test_a_small_twin_is_kept_for_the_next_trace_and_a_large_one_dropped(fast, monkeypatch):
    fast._trace_twin = None
    monkeypatch.setattr(session, "TWIN_KEPT_SHARE", 1.0)  # any twin is small against all of RAM
    trace_generation(fast, "Hello", CONFIG)
    kept = fast._trace_twin
    assert kept is not None
    trace_generation(fast, "Hello", CONFIG)
    assert fast._trace_twin is kept  # not loaded again
    monkeypatch.setattr(session, "TWIN_KEPT_SHARE", 0.0)
    run = trace_generation(fast, "Hello", CONFIG)
    assert run.finished is not None and run.finished.stats.generated_tokens == 2
    assert fast._trace_twin is None


def test_the_cli_says_it_in_one_line_and_exits_2(capsys, monkeypatch):
    from opscope.engine.cli.main import main

    monkeypatch.setattr(session, "TWIN_SLACK", 1e6)
    assert main(["trace", "--fastpath", "activations=f32", "--tokens", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("opscope: error: tracing SmolLM2-135M-Instruct.Q4_1.gguf runs its plain")
    assert "Traceback" not in err[0]
