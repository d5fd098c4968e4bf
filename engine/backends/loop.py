"""A generation loop for backend plugins: give it a Stepper, get the engine's exact event stream.

The built-in torch engine (engine.generate) keeps its own prefill and step so the sampled id can
stay on the GPU; every other backend only has to run its model and sample, and this loop does the
rest: prompt-length checks, chunked prefill with progress events, then the decode bookkeeping all
loops share (engine.decode_book: EOS, ``max_tokens``, stop strings held back until they cannot
start one, ``cancel``, phase markers and statistics).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Protocol

from opscope.engine.core import markers
from opscope.engine.core.clock import now_ns
from opscope.engine.core.errors import ConfigError
from opscope.engine.generation.decode_book import DecodeBook, decode_events
from opscope.engine.generation.events import Finished, PrefillFinished, PrefillProgress, PrefillStarted
from opscope.engine.telemetry import energy


class Stepper(Protocol):
    """One request's model state, driven by :func:`stream_generation`.

    ``forward(ids)`` runs the model over ``ids`` (a prompt chunk, or the one token just sampled),
    appending them to the sequence; the driver reads the clock when it returns, so a lazy framework
    should evaluate at least prompt chunks before returning. ``sample()`` draws the next token id
    from the logits of the last position seen (with the request's sampling options) and returns it
    as an int: that is the point where the host waits for the device.
    """

    def forward(self, ids: list[int]) -> None: ...

    def sample(self) -> int: ...


def check_prompt(prompt_ids: list[int], cfg, max_seq_len: int) -> None:
    if not prompt_ids:
        raise ConfigError("the prompt is empty after tokenization; give at least one token")
    if len(prompt_ids) + cfg.max_tokens > max_seq_len:
        raise ConfigError(
            f"prompt + max_tokens = {len(prompt_ids) + cfg.max_tokens} tokens exceeds the "
            f"model's context of {max_seq_len}; shorten the prompt or lower --max-tokens"
        )


def stream_generation(
    stepper: Stepper,
    tokenizer,
    prompt_ids: list[int],
    cfg,
    cancel: threading.Event | None = None,
    request_ns: int | None = None,
    max_seq_len: int | None = None,
    device: str = "cpu",
) -> Iterator:
    """Yield PrefillStarted, PrefillProgress*, PrefillFinished, Token*, Finished (engine.events).
    ``device`` picks the energy counter for Finished's J/token (engine.energy: "cpu" RAPL, "cuda:N"
    NVML; any other: N/A with the reason)."""
    request_ns = now_ns() if request_ns is None else request_ns
    check_prompt(prompt_ids, cfg, max_seq_len if max_seq_len is not None else 1 << 62)
    n = len(prompt_ids)
    meter = energy.meter_for(device)
    prefill_energy = meter.span()
    t_start = now_ns()
    yield PrefillStarted(n, t_start, request_ns)
    markers.emit(markers.PREFILL, "start", t_start, tokens=n)
    for s in range(0, n, cfg.prefill_chunk):
        stepper.forward(prompt_ids[s : s + cfg.prefill_chunk])
        if s + cfg.prefill_chunk < n:
            yield PrefillProgress(s + cfg.prefill_chunk, n, now_ns())
    token_id = stepper.sample()  # the host waits here: prefill is done when this returns
    t_prefill = now_ns()
    prefill_j, decode_energy = prefill_energy.joules(), meter.span()
    markers.emit(markers.PREFILL, "end", t_prefill, tokens=n)
    yield PrefillFinished(n, t_prefill)
    for event in _decode(stepper, tokenizer, token_id, n, cfg, cancel, (request_ns, t_start, t_prefill)):
        if isinstance(event, Finished):
            event = energy.with_energy(event, meter, prefill_j, decode_energy.joules())
        yield event


def _decode(stepper: Stepper, tokenizer, token_id: int, n: int, cfg, cancel, times) -> Iterator:
    def advance(i: int, ids: list[int]) -> list[int]:
        stepper.forward(ids)
        return [stepper.sample()]

    yield from decode_events(DecodeBook(tokenizer, cfg, n, times, cancel), [token_id], advance)
