"""The backend conformance kit: a pytest suite any backend plugin runs against itself.

In the plugin's tests (see docs/plugins.md)::

    # tests/test_conformance.py
    import pytest
    from opscope.engine.testing.conformance import *  # noqa: F401,F403  the kit's fixtures and tests

    @pytest.fixture(scope="session")
    def backend_name():
        return "mybackend"          # the entry-point name; or parametrize over several

Fixtures a plugin may override: ``backend_name`` (default: $OPSCOPE_CONFORMANCE_BACKEND),
``conformance_backend`` (default: ``engine.backends.get_backend(backend_name)``; return your
Backend object directly to test it before it is installed), ``conformance_device`` ("cpu").
The kit loads the embedded default model once per session and backend.
"""

from __future__ import annotations

import os
import struct
import threading
from dataclasses import dataclass

import pytest
from opscope.engine.backends import API_VERSION, DeviceInfo
from opscope.engine.core.errors import ConfigError, DeviceError, EngineError, ModelFormatError
from opscope.engine.generation.events import Finished, PrefillFinished, PrefillProgress, PrefillStarted, Token

PROMPT = "The quick brown fox jumps over the lazy dog, and"


# -- fixtures --------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def backend_name() -> str:
    name = os.environ.get("OPSCOPE_CONFORMANCE_BACKEND")
    if not name:
        pytest.skip("no backend to test: override the backend_name fixture or set OPSCOPE_CONFORMANCE_BACKEND")
    return name


@pytest.fixture(scope="session")
def conformance_backend(backend_name):
    from opscope.engine.backends import get_backend

    return get_backend(backend_name)


@pytest.fixture(scope="session")
def conformance_device() -> str:
    return "cpu"


@pytest.fixture(scope="session")
def conformance_model(conformance_backend, conformance_device):
    return conformance_backend.load(None, device=conformance_device, dtype="float32")


# -- helpers ---------------------------------------------------------------------------------------
@dataclass
class Run:
    events: list
    tokens: list[Token]
    finished: Finished


def run_generation(model, prompt=PROMPT, cancel_after: int | None = None, **config) -> Run:
    """Generate with a GenerationConfig built from ``config``; set the cancel event once
    ``cancel_after`` tokens have arrived. Checks the stream's shape before returning it."""
    from opscope.engine.generation.config import GenerationConfig

    cancel = threading.Event()
    events = []
    for ev in model.generate(prompt, GenerationConfig(**config), cancel=cancel):
        events.append(ev)
        if cancel_after is not None and sum(isinstance(e, Token) for e in events) >= cancel_after:
            cancel.set()
    assert_well_formed(events)
    return Run(events, [e for e in events if isinstance(e, Token)], events[-1])


def assert_well_formed(events: list) -> None:
    """PrefillStarted, PrefillProgress*, PrefillFinished, Token*, Finished; timestamps never go
    back; tokens numbered from 0; the text pieces plus the tail make the whole text."""
    kinds = [type(e) for e in events]
    assert kinds[0] is PrefillStarted and kinds[-1] is Finished, kinds
    first_token = kinds.index(PrefillFinished)
    assert all(k is PrefillProgress for k in kinds[1:first_token]), kinds
    assert all(k is Token for k in kinds[first_token + 1 : -1]), kinds
    stamps = [events[0].request_t_ns] + [e.t_ns for e in events]
    assert stamps == sorted(stamps), "event timestamps go back in time"
    tokens = [e for e in events if isinstance(e, Token)]
    assert [t.index for t in tokens] == list(range(len(tokens)))
    fin = events[-1]
    assert fin.stop_reason in ("eos", "stop_string", "length", "cancelled")
    assert fin.stats.generated_tokens == len(tokens)
    assert fin.stats.prompt_tokens == events[0].prompt_tokens
    assert "".join(t.text for t in tokens) + fin.tail == fin.text


# -- the backend object ----------------------------------------------------------------------------
def test_declares_the_backend_api(conformance_backend):
    assert isinstance(conformance_backend.name, str) and conformance_backend.name
    assert conformance_backend.api_version == API_VERSION
    available, reason = conformance_backend.is_available()
    assert available is True, reason


def test_lists_the_test_device_as_available(conformance_backend, conformance_device):
    devices = conformance_backend.devices()
    assert devices and all(isinstance(d, DeviceInfo) for d in devices)
    assert all(d.reason for d in devices if not d.available), "an unavailable device must say why"
    assert conformance_device in {d.name for d in devices if d.available}


# -- generation ------------------------------------------------------------------------------------
def test_streams_events_in_order_with_max_tokens(conformance_model):
    run = run_generation(conformance_model, max_tokens=3, ignore_eos=True)
    assert len(run.tokens) == 3 and run.finished.stop_reason == "length"
    assert all(isinstance(t.token_id, int) for t in run.tokens)


def test_reports_prefill_progress_per_chunk(conformance_model):
    run = run_generation(
        conformance_model, max_tokens=1, ignore_eos=True, prefill_chunk=4, reuse_prefix=False
    )  # every chunk prefilled, none taken from the KV cache
    n = run.events[0].prompt_tokens
    progress = [e.done_tokens for e in run.events if isinstance(e, PrefillProgress)]
    assert progress == list(range(4, n, 4))
    assert all(e.total_tokens == n for e in run.events if isinstance(e, PrefillProgress))


def test_greedy_is_deterministic(conformance_model):
    a = run_generation(conformance_model, max_tokens=4, ignore_eos=True)
    b = run_generation(conformance_model, max_tokens=4, ignore_eos=True)
    assert [t.token_id for t in a.tokens] == [t.token_id for t in b.tokens]


def test_token_id_prompt_equals_text_prompt(conformance_model):
    ids = conformance_model.tokenizer.encode(PROMPT)
    a = run_generation(conformance_model, prompt=PROMPT, max_tokens=2, ignore_eos=True)
    b = run_generation(conformance_model, prompt=ids, max_tokens=2, ignore_eos=True)
    assert [t.token_id for t in a.tokens] == [t.token_id for t in b.tokens]


def test_honours_stop_strings(conformance_model):
    ref = run_generation(conformance_model, max_tokens=8, ignore_eos=True)
    text, first = ref.finished.text, len(ref.tokens[0].text)
    stops = [
        text[i : i + 3]
        for i in range(first, len(text) - 2)
        if text[i : i + 3].strip() and text.find(text[i : i + 3]) >= first
    ]
    if not stops:
        pytest.skip(f"the reference text {text!r} offers no stop string after its first token")
    run = run_generation(conformance_model, max_tokens=8, ignore_eos=True, stop=(stops[0],))
    assert run.finished.stop_reason == "stop_string"
    assert run.finished.text == text[: text.find(stops[0])]


def test_honours_cancel(conformance_model):
    run = run_generation(conformance_model, max_tokens=8, ignore_eos=True, cancel_after=1)
    assert run.finished.stop_reason == "cancelled"
    assert 1 <= len(run.tokens) <= 2  # at most one more token after the cancel


def test_chat_uses_the_template(conformance_model):
    from opscope.engine.generation.config import GenerationConfig

    events = list(
        conformance_model.chat(
            [{"role": "user", "content": "Say hi."}], GenerationConfig(max_tokens=2, ignore_eos=True)
        )
    )
    assert_well_formed(events)
    assert events[0].prompt_tokens > len(conformance_model.tokenizer.encode("Say hi."))


def test_reports_memory(conformance_model):
    stats = conformance_model.memory_stats()
    assert "weights_bytes" in stats
    assert all(k.endswith("_bytes") and isinstance(v, int) and v >= 0 for k, v in stats.items()), stats


# -- bad input -------------------------------------------------------------------------------------
def test_rejects_empty_prompt(conformance_model):
    with pytest.raises(ConfigError):
        list(conformance_model.generate([]))


def test_rejects_token_ids_outside_the_vocabulary(conformance_model):
    with pytest.raises(ConfigError):
        list(conformance_model.generate([10**9]))


def test_rejects_missing_model_file(conformance_backend, conformance_device, tmp_path):
    with pytest.raises(ModelFormatError):
        conformance_backend.load(tmp_path / "missing.gguf", device=conformance_device)


def test_rejects_corrupt_model_file(conformance_backend, conformance_device, tmp_path):
    bad = tmp_path / "corrupt.gguf"  # GGUF v3 claiming 2**40 tensors, then cut off
    bad.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1 << 40, 1) + b"\x00" * 7)
    with pytest.raises(ModelFormatError):
        conformance_backend.load(bad, device=conformance_device)


def test_rejects_unknown_device(conformance_backend):
    with pytest.raises(DeviceError):
        conformance_backend.load(None, device="no-such-device")


def test_rejects_unknown_dtype(conformance_backend, conformance_device):
    with pytest.raises(ConfigError):
        conformance_backend.load(None, device=conformance_device, dtype="float7")


def test_rejects_unknown_option(conformance_backend, conformance_device):
    with pytest.raises(EngineError):
        conformance_backend.load(None, device=conformance_device, no_such_option=1)


# `from engine.testing.conformance import *` brings in every fixture and test above.
__all__ = [
    "backend_name",
    "conformance_backend",
    "conformance_device",
    "conformance_model",
    "Run",
    "run_generation",
    "assert_well_formed",
] + sorted(n for n in dir() if n.startswith("test_"))
