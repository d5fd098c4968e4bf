"""A new prompt reuses the KV cache of the prefix it shares with what the model last processed
(engine.prefix_cache): same tokens as without reuse, only the new suffix prefilled, and never a
stale cache after another path wrote it. Both the fast path (default load) and the plain model."""

from __future__ import annotations

import pytest
from opscope.engine.generation.events import Finished, PrefillFinished, PrefillStarted, Token
from opscope.engine.generation.generate import GenerationConfig

TURNS = ["What is the capital of France?", "Tell me one fact about it.", "And about Germany?"]
TOKENS = 20


@pytest.fixture(scope="module", params=["auto", "off"])
def models(request, one_torch_thread, default_model_2_layers):
    """(model that reuses, fresh model used only without reuse) for one load path: the default
    model's first 2 layers (gguf_craft.first_layers_gguf: its tokenizer, chat template and weights;
    what is reused is the same whatever the depth, at a fraction of each turn's time)."""
    from opscope.engine.api import load

    path = str(default_model_2_layers)
    return load(path, fastpath=request.param), load(path, fastpath=request.param)


def run(lm, prompt, reuse=True, tokens=TOKENS, **cfg):
    """(token ids, Finished, PrefillStarted, [(T, start)] of the prefill's forward calls) of one
    chat (``prompt`` a message list) or generation (``prompt`` a token list)."""
    calls, prefill_calls = [], None
    hook = lm.model.register_forward_pre_hook(lambda _m, args: calls.append((args[0].shape[1], int(args[1]))))
    config = GenerationConfig(max_tokens=tokens, reuse_prefix=reuse, **cfg)
    events = lm.chat(prompt, config) if isinstance(prompt[0], dict) else lm.generate(prompt, config)
    tokens, done, started = [], None, None
    try:
        for ev in events:
            if isinstance(ev, PrefillStarted):
                started = ev
            elif isinstance(ev, PrefillFinished):
                prefill_calls = list(calls)
            elif isinstance(ev, Token):
                tokens.append(ev.token_id)
            elif isinstance(ev, Finished):
                done = ev
    finally:
        hook.remove()
    return tokens, done, started, prefill_calls


def prompt_ids(lm, messages) -> list[int]:
    text = lm.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    return lm.tokenizer.encode(text, add_special_tokens=False)


def fed_ids(prompt: list[int], tokens: list[int], done: Finished) -> list[int]:
    """The ids a generation fed through the model: the prompt and every generated token except
    the last one when it stopped on the length limit (that one was sampled, never fed)."""
    return prompt + (tokens[:-1] if done.stop_reason == "length" else tokens)


def common(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def converse(lm, fresh, messages):
    """Run the turns on ``lm`` with reuse and on ``fresh`` without, checking each turn; returns
    the messages with the replies and the ids ``lm`` fed last."""
    from opscope.engine.generation import prefix_cache

    prefix_cache.forget(lm.model)  # start from an unknown cache, as after a load
    messages, held = list(messages), []
    for turn, text in enumerate(TURNS):
        messages.append({"role": "user", "content": text})
        ids = prompt_ids(lm, messages)
        tokens, done, started, prefill = run(lm, messages)
        want, ref_done, _, _ = run(fresh, messages, reuse=False)
        assert tokens == want, f"turn {turn}"
        expect = min(common(held, ids), len(ids) - 1)
        if turn:
            assert expect > len(prompt_ids(lm, messages[:-2])), "the previous prompt and reply are shared"
        assert done.stats.cached_tokens == started.cached_tokens == expect
        assert ref_done.stats.cached_tokens == 0
        # only the suffix went through the model, starting at the first position not reused
        assert prefill[0][1] == expect and sum(t for t, _ in prefill) == len(ids) - expect
        held = fed_ids(ids, tokens, done)
        messages.append({"role": "assistant", "content": done.text})
    return messages, held


def test_multi_turn_with_reuse_gives_the_tokens_of_no_reuse(models):
    converse(*models, [])


def test_an_edited_earlier_message_reuses_up_to_the_edit(models):
    lm, fresh = models
    messages, held = converse(lm, fresh, [])
    edited = [dict(m) for m in messages[:-1]]
    edited[2]["content"] = "Tell me two facts about it."  # the second user message, mid-history
    ids = prompt_ids(lm, edited)
    tokens, done, _, prefill = run(lm, edited)
    assert tokens == run(fresh, edited, reuse=False)[0]
    cut = common(held, ids)
    assert len(prompt_ids(lm, messages[:1])) < cut < len(prompt_ids(lm, messages[:3]))
    assert done.stats.cached_tokens == cut and prefill[0][1] == cut


def test_a_longer_prompt_that_grows_the_cache_keeps_the_prefix(models):
    lm, fresh = models
    first = [{"role": "user", "content": "Hi"}]
    _, done, _, _ = run(lm, first)
    long = first + [
        {"role": "assistant", "content": done.text},
        {"role": "user", "content": "Please count: " + " ".join(str(i) for i in range(150))},
    ]
    before = lm.model.max_cache_len
    assert len(prompt_ids(lm, long)) + TOKENS > before  # the cache has to be re-allocated larger
    tokens, done, _, _ = run(lm, long)
    assert lm.model.max_cache_len > before
    assert done.stats.cached_tokens > len(prompt_ids(lm, first))
    assert tokens == run(fresh, long, reuse=False)[0]


def test_sampling_with_a_seed_is_unchanged_by_reuse(models):
    lm, fresh = models
    messages = [{"role": "user", "content": "Write a word."}]
    _, done, _, _ = run(lm, messages)
    messages += [{"role": "assistant", "content": done.text}, {"role": "user", "content": "Another."}]
    tokens, done, _, _ = run(lm, messages, temperature=0.9, seed=7, top_k=40)
    assert done.stats.cached_tokens > 0
    assert tokens == run(fresh, messages, reuse=False, temperature=0.9, seed=7, top_k=40)[0]


CODE_TURNS = ["Write a python function with numbers 12345 and a list.", "And more?", "Once more, with 678."]


def sampled_conversation(lm, turns):
    """Three sampled turns (code and numbers: the replies are not the canonical tokenization of
    their own text); [(prompt ids fed, Finished, PrefillStarted)] per turn."""
    from opscope.engine.generation import prefix_cache

    prefix_cache.forget(lm.model)
    messages, out = [], []
    for turn, text in enumerate(turns):
        messages.append({"role": "user", "content": text})
        calls = []
        hook = lm.model.register_forward_pre_hook(lambda _m, args, calls=calls: calls.append(args[0][0].tolist()))
        try:
            tokens, done, started, prefill = run(lm, messages, tokens=64, temperature=1.3, seed=turn)
        finally:
            hook.remove()
        fed = [i for ids in calls[: len(prefill)] for i in ids]
        out.append((fed, tokens, done, started))
        messages.append({"role": "assistant", "content": done.text})
    return out


def test_each_sampled_turn_reuses_the_whole_previous_turn(models):
    """Turn one left prompt + reply in the cache; turn two re-rendered the reply's text, whose
    tokenization differs from the sampled ids mid-reply, and reused only up to there."""
    lm, _fresh = models
    turns = sampled_conversation(lm, CODE_TURNS)
    first_fed, first_tokens, first_done, _ = turns[0]
    canonical = lm.tokenizer.encode(first_done.text, add_special_tokens=False)
    assert canonical[: len(first_tokens) - 1] != first_tokens[:-1]  # the case that used to break
    held = first_fed
    for fed, tokens, done, started in turns:
        if done is not first_done:
            assert started.cached_tokens == done.stats.cached_tokens == len(held)
        held = held[: started.cached_tokens] + fed + (tokens[:-1] if done.stop_reason == "length" else tokens)


def test_a_snapshot_restores_the_cache_into_a_reloaded_model(lm_plain):
    """What the worker does around a failed load of another file: the reloaded model reuses the
    conversation instead of re-reading it."""
    from opscope.engine.api import load
    from opscope.engine.generation import prefix_cache

    messages = [{"role": "user", "content": TURNS[0]}]
    _, done, _, _ = run(lm_plain, messages)
    snap = prefix_cache.snapshot(lm_plain.model)
    again = load(fastpath="off")
    prefix_cache.restore(again.model, snap)
    messages += [{"role": "assistant", "content": done.text}, {"role": "user", "content": TURNS[1]}]
    tokens, done, _, _ = run(again, messages)
    assert done.stats.cached_tokens == len(snap.ids) > 0
    assert tokens == run(lm_plain, messages, reuse=False)[0]


def _batch(lm):
    for _ in lm.generate_batch(["The sky is", "Paris is"], GenerationConfig(max_tokens=4)):
        pass


def _logits(lm):
    lm.logits([1, 2, 3, 4])


def _bench_suite(lm):
    from opscope.engine.bench.measure.options import BenchOptions
    from opscope.engine.bench.suites.llm import pp_point

    pp_point(lm, 8, 16, BenchOptions(), {}).prepare()()  # setup_cache, fill, one measured step


def _direct_forward(lm):
    """A writer that bypasses every invalidation: a forward pass over the same cache buffers."""
    import torch

    with torch.inference_mode():
        lm.model(torch.tensor([[5, 6, 7]]), 0)


@pytest.mark.parametrize("other", [_batch, _logits, _bench_suite, _direct_forward])
def test_no_stale_reuse_after_another_cache_user(models, other):
    lm, fresh = models
    messages = [{"role": "user", "content": "Name a color."}]
    run(lm, messages)
    assert run(lm, messages)[1].stats.cached_tokens == len(prompt_ids(lm, messages)) - 1  # would reuse
    other(lm)
    tokens, done, _, prefill = run(lm, messages)
    assert done.stats.cached_tokens == 0 and prefill[0][1] == 0
    assert tokens == run(fresh, messages, reuse=False)[0]


def test_reuse_off_prefills_everything(models):
    lm, _ = models
    messages = [{"role": "user", "content": "Hello there"}]
    run(lm, messages)
    _, done, _, prefill = run(lm, messages, reuse=False)
    assert done.stats.cached_tokens == 0 and sum(t for t, _ in prefill) == len(prompt_ids(lm, messages))


def test_shared_model_reuses_across_generate_calls(lm):
    """The session model (fast path) too; its record is dropped afterwards so that other tests see
    it as they found it."""
    from opscope.engine.generation import prefix_cache

    ids = lm.tokenizer.encode("The quick brown fox jumps over the lazy dog")
    try:
        first, _, _, _ = run(lm, ids, reuse=False)
        again, done, _, prefill = run(lm, ids)
        assert again == first and done.stats.cached_tokens == len(ids) - 1 and prefill == [(1, len(ids) - 1)]
    finally:
        prefix_cache.forget(lm.model)


def test_stats_line_shows_the_cached_count():
    from opscope.app.chat.session import format_stats

    stats = {
        "ttft_ms": 40.0,
        "prefill_tok_s": 300.0,
        "decode_tok_s": 20.0,
        "prompt_tokens": 200,
        "generated_tokens": 8,
        "cached_tokens": 180,
    }
    assert format_stats(stats, "eos") == (
        "TTFT 40 ms · prefill 200 tok (180 cached) · decode 20.0 tok/s · 8 generated tokens · stop: eos"
    )
    assert "cached" not in format_stats({**stats, "cached_tokens": 0}, "eos")


def test_stats_line_shows_a_prefill_rate_only_over_enough_uncached_tokens():
    """1 uncached token over a 1.8 s step read "prefill 0.6 tok/s": a step's cost, not a rate."""
    from opscope.app.chat.session import format_stats

    stats = {
        "ttft_ms": 1815.0,
        "prefill_tok_s": 0.6,
        "decode_tok_s": 4.0,
        "prompt_tokens": 40,
        "generated_tokens": 8,
        "cached_tokens": 39,
    }
    assert format_stats(stats, "eos").startswith("TTFT 1815 ms · prefill 40 tok (39 cached) · decode 4.0 tok/s")
    many = format_stats({**stats, "prompt_tokens": 200, "prefill_tok_s": 150.0}, "eos")
    assert many.startswith("TTFT 1815 ms · prefill 200 tok (39 cached), 150.0 tok/s · decode")


@pytest.mark.gui
@pytest.mark.slow
def test_the_window_reuses_the_conversation_in_the_worker(qapp, qtbot, tmp_path):
    """The worker keeps one model across chat turns: the second turn's reply says how many prompt
    tokens came from the cache, and the stats line shows it."""
    from app_testing import close_window, open_window

    win = open_window(qapp, tmp_path)
    try:
        chat = win.chat
        chat.sampling.temperature.setValue(0.0)
        turns = []
        for text in ("My name is Ada.", "What is my name?"):
            chat.sampling.max_tokens.setValue(8)
            chat.input.setPlainText(text)
            with qtbot.waitSignal(chat.session.replyFinished, timeout=180_000) as blocker:
                chat.send_button.click()
            turns.append(blocker.args[0])
        first, second = (t.stats for t in turns)
        assert first["cached_tokens"] == 0
        assert first["prompt_tokens"] < second["cached_tokens"] < second["prompt_tokens"]
        assert f"· prefill {second['prompt_tokens']} tok ({second['cached_tokens']} cached)" in chat.stats_label.text()
    finally:
        close_window(win)


def test_a_warm_up_leaves_nothing_to_reuse_and_the_tokens_unchanged(models):
    """engine.generation.warm_up (what a GPU load runs): its cache is forgotten, so the next request
    prefills from position 0 and generates what it would have without it."""
    from opscope.engine.generation.generate import WARM_UP_TOKENS, warm_up

    lm, fresh = models
    prompt = prompt_ids(lm, [{"role": "user", "content": TURNS[0]}])
    run(lm, prompt)  # a cache worth reusing: the same prompt again would reuse all but its last id
    warm_up(lm.model)
    assert lm.model.max_cache_len > WARM_UP_TOKENS
    tokens, done, started, prefill = run(lm, prompt)
    want, _, _, _ = run(fresh, prompt, reuse=False)
    assert tokens == want
    assert done.stats.cached_tokens == started.cached_tokens == 0
    assert prefill[0] == (len(prompt), 0)
