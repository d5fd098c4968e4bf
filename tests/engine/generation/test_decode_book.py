"""The decode bookkeeping (engine.decode_book) as each of the three loops uses it: engine.generate,
engine.batch and engine.backends.loop (the plugin loop).

The model is a real one-layer Transformer whose output is chosen: its layer weights are zero (the
residual stream is the embedding), the embedding gives each script token its own direction and the
head maps that direction to the token that follows it in a sentence tokenized by the default
model's own tokenizer. Greedy decoding then writes that sentence token by token, so the stop
strings, EOS ids and counts expected below are read off the sentence, not off the engine.
"""

from __future__ import annotations

import threading

import pytest
import torch
from opscope.engine.generation.config import GenerationConfig
from opscope.engine.generation.events import Finished, Token
from opscope.engine.models.config import ModelConfig
from opscope.engine.models.transformer import Transformer

SENTENCE = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def tokenizer():
    from opscope.engine.formats import open_model

    return open_model(None).tokenizer


@pytest.fixture(scope="module")
def script(tokenizer) -> list[int]:
    ids = tokenizer.encode(SENTENCE, add_special_tokens=False)
    assert len(set(ids)) == len(ids) and "".join(tokenizer.decode([i]) for i in ids) == SENTENCE
    return ids


def scripted_model(tokenizer, chain: list[int], dim: int = 32) -> Transformer:
    """Greedy decoding after chain[j] gives chain[j + 1]."""
    cfg = ModelConfig(
        dim=dim,
        n_layers=1,
        n_heads=2,
        n_kv_heads=1,
        hidden_dim=dim,
        vocab_size=49152,
        max_seq_len=64,
        tie_embeddings=False,
    )
    model = Transformer.random(cfg, seed=0).eval().requires_grad_(False)
    with torch.no_grad():
        for p in model.layers.parameters():
            p.zero_()
        model.embed.weight.zero_()
        model.lm_head.weight.zero_()
        for j, (tok, nxt) in enumerate(zip(chain, chain[1:])):
            model.embed.weight[tok, j] = 1.0
            model.lm_head.weight[nxt, j] = 1.0
    model.decode_threads = None
    return model


class TorchStepper:
    """A plugin-style backend over the same model: what engine.backends.loop drives."""

    def __init__(self, model):
        self.model, self.pos, self.logits = model, 0, None
        model.setup_cache(1, model.config.max_seq_len)

    def forward(self, ids: list[int]) -> None:
        with torch.inference_mode():
            self.logits = self.model(torch.tensor([ids]), self.pos, last_only=True)[0, -1]
        self.pos += len(ids)

    def sample(self) -> int:
        return int(self.logits.argmax())


def run(loop: str, model, tokenizer, prompt: list[int], cfg: GenerationConfig, cancel_at: int | None = None):
    """Events of one generation by ``loop``; ``cancel_at``: set cancel while handling that Token."""
    cancel = threading.Event()
    if loop == "generate":
        from opscope.engine.generation.generate import generate

        events = generate(model, tokenizer, prompt, cfg, cancel)
    elif loop == "batch":
        from opscope.engine.generation.batch import generate_batch

        events = generate_batch(model, tokenizer, [prompt, [tokenizer.pad_id + 1] + prompt], cfg, cancel)
    else:
        from opscope.engine.backends.loop import stream_generation

        events = stream_generation(TorchStepper(model), tokenizer, prompt, cfg, cancel)
    out = []
    for e in events:
        out.append(e)
        if isinstance(e, Token) and e.seq == 0 and e.index == cancel_at:
            cancel.set()
    return out


def rows(events) -> dict[int, list[Token]]:
    got: dict[int, list[Token]] = {}
    for e in events:
        if isinstance(e, Token):
            got.setdefault(e.seq, []).append(e)
    return got


LOOPS = ("generate", "batch", "loop")


@pytest.mark.parametrize("loop", LOOPS)
def test_stop_string_split_across_tokens(loop, tokenizer, script):
    model = scripted_model(tokenizer, script)
    events = run(loop, model, tokenizer, script[:1], GenerationConfig(max_tokens=20, stop=("own f",)))
    done = events[-1]
    assert isinstance(done, Finished) and done.stop_reason == "stop_string"
    assert done.text == " quick br" and done.tail == ""
    for toks in rows(events).values():
        assert [t.token_id for t in toks] == script[1:4]  # " quick", " brown", " fox": the stop ends in " fox"
        assert "".join(t.text for t in toks) == " quick br"  # "own" was held back, then cut
    assert done.stats.generated_tokens == 3


@pytest.mark.parametrize("loop", LOOPS)
def test_eos_as_the_first_token(loop, tokenizer, script):
    model = scripted_model(tokenizer, [script[0], tokenizer.eos_ids[0]])
    events = run(loop, model, tokenizer, script[:1], GenerationConfig(max_tokens=8))
    done = events[-1]
    assert not rows(events) and done.stop_reason == "eos"
    assert done.text == "" and done.stats.generated_tokens == 0
    assert done.stats.ttft_ms >= 0


@pytest.mark.parametrize("loop", LOOPS)
def test_eos_mid_sentence_ends_the_text_before_it(loop, tokenizer, script):
    model = scripted_model(tokenizer, script[:4] + [tokenizer.eos_ids[0]])
    done = run(loop, model, tokenizer, script[:1], GenerationConfig(max_tokens=8))[-1]
    assert (done.stop_reason, done.text, done.stats.generated_tokens) == ("eos", " quick brown fox", 3)


@pytest.mark.parametrize("loop", LOOPS)
def test_cancel_mid_decode(loop, tokenizer, script):
    model = scripted_model(tokenizer, script)
    events = run(loop, model, tokenizer, script[:1], GenerationConfig(max_tokens=20), cancel_at=1)
    done = events[-1]
    assert done.stop_reason == "cancelled"
    for toks in rows(events).values():
        assert [t.token_id for t in toks] == script[1:3]
    assert done.text == " quick brown" and done.stats.generated_tokens == 2


@pytest.mark.parametrize("loop", LOOPS)
def test_max_tokens_one(loop, tokenizer, script):
    model = scripted_model(tokenizer, script)
    events = run(loop, model, tokenizer, script[:1], GenerationConfig(max_tokens=1))
    done = events[-1]
    assert done.stop_reason == "length" and done.stats.generated_tokens == 1
    assert [[t.token_id for t in toks] for toks in rows(events).values()] == [script[1:2]] * (
        2 if loop == "batch" else 1
    )
    assert done.text == " quick" and done.stats.ttft_ms == pytest.approx(
        (rows(events)[0][0].t_ns - events[0].request_t_ns) / 1e6
    )
    assert done.stats.itl_ms == ()


@pytest.mark.parametrize("loop", LOOPS)
def test_stop_string_held_back_then_released_at_the_end(loop, tokenizer, script):
    """A tail that could start a stop string is held back; at max_tokens it comes back in ``tail``."""
    model = scripted_model(tokenizer, script)
    done = run(loop, model, tokenizer, script[:1], GenerationConfig(max_tokens=2, stop=("own fox!",)))[-1]
    assert done.stop_reason == "length"
    assert done.text == " quick brown" and done.tail == "own"


def test_batch_rows_finish_on_their_own(tokenizer, script):
    """Row 1 meets EOS first; row 0 runs on to its stop string; Finished reports row 0."""
    from opscope.engine.generation.batch import generate_batch

    chain = script[:6]  # The quick brown fox jumps over
    model = scripted_model(tokenizer, chain + [tokenizer.eos_ids[0]])
    cfg = GenerationConfig(max_tokens=20, stop=("brown f",))
    events = list(generate_batch(model, tokenizer, [chain[:1], chain[:5]], cfg))
    got = rows(events)
    assert [t.token_id for t in got[1]] == chain[5:6]  # " over", then EOS
    assert [t.token_id for t in got[0]] == chain[1:4]  # " quick", " brown", " fox": the stop ends in " fox"
    assert [t.index for t in got[0]] == [0, 1, 2]
    assert "".join(t.text for t in got[0]) == " quick "
    assert events[-1].stop_reason == "stop_string" and events[-1].text == " quick "
