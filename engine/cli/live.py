"""Live status of a reply on a terminal's stderr, as the window shows it: prompt progress while the
prompt is prefilled, then the decode rate while the reply streams.

The reply goes to stdout; the status is drawn on stderr and only where stderr is a terminal (a pipe
or a file gets the reply and the final stats line, nothing else). Prefill progress is one line
rewritten in place and erased when the first token arrives. The decode rate is drawn just after the
reply's last character with the cursor saved and restored (ESC 7 / ESC 8), and erased (ESC [K)
before the next piece is written, so the reply's text is never mixed with it; it is drawn only
where it fits on the current line (a wrapped status could not be erased).
"""

from __future__ import annotations

import shutil

from opscope.engine.generation.events import PrefillProgress, PrefillStarted, Token

ERASE_LINE, ERASE_REST, SAVE, RESTORE = "\r\x1b[K", "\x1b[K", "\x1b7", "\x1b8"
UPDATE_NS = 250_000_000  # a rate redrawn at most 4 times a second: readable, and no flicker


class LiveStatus:
    """Fed every event of a generation (``before`` ahead of the reply text, ``after`` once it is
    written); writes to ``err`` only when it is a terminal."""

    def __init__(self, err, out_is_err_terminal: bool):
        self.err, self.on = err, isatty(err)
        self.same_screen = out_is_err_terminal  # the reply is on the same screen: track its column
        self.cached = self.first_ns = self.drawn_ns = self.column = 0
        self.prefilling = self.drawn = False

    def before(self, ev) -> None:
        """Clears what is drawn before the reply text lands where it is."""
        if not self.on:
            return
        if isinstance(ev, PrefillStarted):
            self.cached, self.prefilling = ev.cached_tokens, True
            self._write(ERASE_LINE + self._prefill_text(ev.cached_tokens, ev.prompt_tokens))
        elif isinstance(ev, PrefillProgress):
            self._write(ERASE_LINE + self._prefill_text(ev.done_tokens, ev.total_tokens))
        elif isinstance(ev, Token) and self.prefilling:
            self.prefilling = False
            self.first_ns = ev.t_ns
            self._write(ERASE_LINE)
        elif isinstance(ev, Token) and self.drawn:
            self._write(ERASE_REST)
            self.drawn = False

    def after(self, ev, text: str) -> None:
        """Draws the decode rate after ``text`` (what was just written of the reply)."""
        if not self.on or not isinstance(ev, Token):
            return
        self._advance(text)
        due = ev.index == 1 or ev.t_ns - self.drawn_ns >= UPDATE_NS
        if ev.index < 1 or not due or ev.t_ns <= self.first_ns:
            return
        status = f"  [{ev.index / ((ev.t_ns - self.first_ns) / 1e9):.1f} tok/s]"
        if self.column + len(status) < shutil.get_terminal_size().columns:
            self._write(SAVE + status + RESTORE)
            self.drawn, self.drawn_ns = True, ev.t_ns

    def close(self) -> None:
        """Erases what is drawn (before the reply's tail, and at the end however it ends)."""
        if self.on and (self.drawn or self.prefilling):
            self._write(ERASE_REST if self.drawn else ERASE_LINE)
        self.drawn = self.prefilling = False

    def _prefill_text(self, done: int, total: int) -> str:
        cached = f" ({self.cached} cached)" if self.cached else ""
        return f"[prompt {done}/{total} tok{cached}]"

    def _advance(self, text: str) -> None:
        if self.same_screen:
            last = text.rsplit("\n", 1)
            self.column = len(last[-1]) if len(last) > 1 else self.column + len(text)

    def _write(self, text: str) -> None:
        try:
            self.err.write(text)
            self.err.flush()
        except (OSError, ValueError):  # stderr closed: the status is not worth failing for
            self.on = False


def isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
