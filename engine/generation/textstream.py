"""Streaming text out of token ids (torch-free; shared by every backend)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from opscope.engine.tokenizer.loader import Tokenizer


class TextStream:
    """Printable text out of token ids, holding back any tail that could start a stop string."""

    def __init__(self, tokenizer: Tokenizer, stop: tuple[str, ...]) -> None:
        self.decoder, self.stop = tokenizer.stream(), stop
        self.text, self.emitted = "", 0

    def push(self, token_id: int) -> tuple[str, bool]:
        self.text += self.decoder.push(token_id)
        for s in self.stop:
            i = self.text.find(s, max(0, self.emitted - len(s)))
            if i >= 0:
                self.text = self.text[:i]
                return self._take(len(self.text)), True
        hold = max((k for s in self.stop for k in range(1, len(s)) if self.text.endswith(s[:k])), default=0)
        return self._take(len(self.text) - hold), False

    def finish(self) -> str:
        self.text += self.decoder.flush()
        return self._take(len(self.text))

    def _take(self, upto: int) -> str:
        piece, self.emitted = self.text[self.emitted : max(upto, self.emitted)], max(upto, self.emitted)
        return piece
