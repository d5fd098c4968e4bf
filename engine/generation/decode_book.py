"""The decode bookkeeping every generation loop shares (torch-free): EOS ids, stop strings with the
text-stream hold-back, ``max_tokens``, the cancel event, timestamps, phase markers and the Finished
event with its statistics and finish reason.

A loop only computes the next token ids; :func:`decode_events` does the rest:

    book = DecodeBook(tokenizer, cfg, prompt_tokens, times, cancel)
    yield from decode_events(book, first_ids, advance)  # advance(i, ids): step i+1's ids

Per step ``i`` (one id per row; rows are the sequences of a batch, one for single generation):
the step's timestamp is read (the prefill end for step 0, so TTFT and ITL come from the same clock
reads as the events); a row whose id is an EOS id is done without a Token; every other row gets a
Token with the printable text its stream releases, and is done when that completes a stop string.
The loop stops when every row is done, or — checked after the step's Tokens were consumed, so a
consumer can set ``cancel`` while handling one — when ``cancel`` is set or ``max_tokens`` is reached.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING

from opscope.engine.core import markers
from opscope.engine.core.clock import now_ns
from opscope.engine.generation.events import Finished, Token, stats_from_times
from opscope.engine.generation.textstream import TextStream

if TYPE_CHECKING:
    from opscope.engine.generation.config import GenerationConfig
    from opscope.engine.tokenizer.loader import Tokenizer


class DecodeBook:
    """One generation's decode state: per-row text streams and finish reasons, step timestamps.

    ``times`` is (request_ns, prefill_start_ns, prefill_end_ns); ``prompt_tokens`` is what the
    statistics report as the prompt (B·L for a padded batch). ``marker_fields`` go on the decode
    phase markers (e.g. ``batch=B``). The decode-start marker is emitted here."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        cfg: GenerationConfig,
        prompt_tokens: int,
        times: tuple[int, int, int],
        cancel: threading.Event | None = None,
        rows: int = 1,
        **marker_fields: object,
    ) -> None:
        self.cfg, self.prompt_tokens, self.times, self.cancel = cfg, prompt_tokens, times, cancel
        self.eos = frozenset() if cfg.ignore_eos else frozenset(tokenizer.eos_ids)
        self.streams = [TextStream(tokenizer, cfg.stop) for _ in range(rows)]
        self.row_reason: list[str | None] = [None] * rows  # "eos" | "stop_string" once a row is done
        self.token_ns: list[int] = []  # one timestamp per step that produced a Token
        self.reason: str | None = None  # the finish reason, once decided
        self.marker_fields = marker_fields
        markers.emit(markers.DECODE, "start", times[2], **marker_fields)

    def step(self, i: int, ids: list[int]) -> Iterator[Token]:
        """Yield step ``i``'s Tokens (``ids``: one id per row), then decide whether to stop."""
        t = now_ns() if i else self.times[2]
        for b, tok in enumerate(ids):
            if self.row_reason[b] is None and tok in self.eos:
                self.row_reason[b] = "eos"
        if self._all_rows_done():
            return
        self.token_ns.append(t)
        for b, tok in enumerate(ids):
            if self.row_reason[b] is None:
                piece, stopped = self.streams[b].push(tok)
                if stopped:
                    self.row_reason[b] = "stop_string"
                yield Token(i, tok, piece, t, seq=b)
        if self._all_rows_done():
            return
        if self.cancel is not None and self.cancel.is_set():
            self.reason = "cancelled"
        elif i + 1 >= self.cfg.max_tokens:
            self.reason = "length"

    def _all_rows_done(self) -> bool:
        if all(r is not None for r in self.row_reason):
            self.reason = self.row_reason[0]  # Finished reports sequence 0
        return self.reason is not None

    def finished(self) -> Finished:
        """The Finished event: sequence 0's text and the tail its stream still held (none after a
        stop string), statistics from the step timestamps. Emits the decode-end marker."""
        reason = self.reason or "length"
        stream = self.streams[0]
        tail = stream.finish() if self.row_reason[0] != "stop_string" else ""
        end = now_ns()
        markers.emit(markers.DECODE, "end", end, tokens=len(self.token_ns), **self.marker_fields)
        request_ns, t_start, t_prefill = self.times
        stats = stats_from_times(request_ns, t_start, t_prefill, self.prompt_tokens, self.token_ns or [t_prefill], end)
        if not self.token_ns:  # EOS first: TTFT is still the time to that token; nothing was generated
            stats = replace(stats, generated_tokens=0)
        return Finished(reason, stats, end, text=stream.text, tail=tail)


def decode_events(book: DecodeBook, ids: list[int], advance: Callable[[int, list[int]], list[int]]) -> Iterator:
    """Yield Token* then Finished: ``ids`` are step 0's ids (sampled from the prefill), and
    ``advance(i, ids)`` runs the model on step ``i``'s ids and returns step ``i + 1``'s."""
    for i in range(book.cfg.max_tokens):
        yield from book.step(i, ids)
        if book.reason is not None:
            break
        ids = advance(i, ids)
    yield book.finished()
