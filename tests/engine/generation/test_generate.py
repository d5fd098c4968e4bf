"""Generation semantics on the real default model: event order, timestamps, stops, cancel, seeds."""

from __future__ import annotations

import threading

import pytest
from opscope.engine.core.errors import ConfigError
from opscope.engine.generation.events import Finished, PrefillFinished, PrefillProgress, PrefillStarted, Token
from opscope.engine.generation.generate import GenerationConfig

pytestmark = pytest.mark.slow


def test_event_order_and_monotonic_timestamps(lm):
    events = list(lm.generate("Count: one, two,", GenerationConfig(max_tokens=6, ignore_eos=True, prefill_chunk=2)))
    kinds = [type(e) for e in events]
    assert kinds[0] is PrefillStarted and PrefillProgress in kinds
    assert kinds.index(PrefillFinished) < kinds.index(Token) and kinds[-1] is Finished
    times = [e.t_ns for e in events]
    assert times == sorted(times)
    done = events[-1]
    tokens = [e for e in events if isinstance(e, Token)]
    assert done.stats.generated_tokens == len(tokens) == 6 and done.stop_reason == "length"
    assert done.stats.ttft_ms == pytest.approx((tokens[0].t_ns - events[0].request_t_ns) / 1e6)
    assert done.text == "".join(t.text for t in tokens) + done.tail


def test_stop_string_cuts_text(lm):
    events = list(lm.generate("1, 2, 3, 4, 5, 6,", GenerationConfig(max_tokens=30, stop=(" 9",), ignore_eos=True)))
    done = events[-1]
    assert done.stop_reason == "stop_string"
    assert " 9" not in done.text and "8" in done.text
    assert "".join(e.text for e in events if isinstance(e, Token)) == done.text


def test_cancel_stops_between_tokens(lm):
    cancel = threading.Event()
    n = 0
    for ev in lm.generate("Tell me a long story.", GenerationConfig(max_tokens=100, ignore_eos=True), cancel):
        if isinstance(ev, Token):
            n += 1
            if n == 3:
                cancel.set()
        if isinstance(ev, Finished):
            assert ev.stop_reason == "cancelled"
    assert n == 3


def test_seed_makes_sampling_reproducible(lm):
    cfg = GenerationConfig(max_tokens=12, temperature=0.9, top_p=0.95, seed=123, ignore_eos=True)
    runs = [[e.token_id for e in lm.generate("Once", cfg) if isinstance(e, Token)] for _ in range(2)]
    assert runs[0] == runs[1]


def test_prompt_too_long_is_a_config_error(lm):
    with pytest.raises(ConfigError, match="context"):
        list(lm.generate([1] * 10, GenerationConfig(max_tokens=lm.config.max_seq_len)))


@pytest.mark.parametrize("bad", [dict(max_tokens=0), dict(temperature=-1), dict(top_p=0), dict(min_p=1.5)])
def test_invalid_settings_are_rejected(bad):
    with pytest.raises(ConfigError):
        GenerationConfig(**bad)


def test_out_of_vocab_ids_are_rejected(lm):
    with pytest.raises(ConfigError, match="vocabulary"):
        lm.generate([10**9], GenerationConfig(max_tokens=1))
