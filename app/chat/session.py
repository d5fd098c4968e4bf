"""The Chat panel's model: a multi-turn conversation streamed from the engine worker.

Views subscribe to the signals; nothing here touches a widget. The whole history (plus the system
prompt) goes to the worker on every turn and the engine renders it with the model's chat template.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from app.engine_client import EngineClient, Job
from app.protocol import ChatRequest


@dataclass
class Turn:
    role: str  # "user" | "assistant"
    content: str
    stats: dict | None = None  # engine.events.GenerationStats.as_dict() for assistant replies
    stop_reason: str = ""
    error: str = ""
    extra: dict = field(default_factory=dict)


def format_stats(stats: dict | None, stop_reason: str) -> str:
    """One line a person reads: TTFT, prefill tok/s, decode tok/s, tokens, stop reason."""
    if not stats:
        return f"stop: {stop_reason}" if stop_reason else ""

    def num(key: str, fmt: str) -> str:
        value = stats.get(key)
        return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, fmt)

    return (f"TTFT {num('ttft_ms', '.0f')} ms · prefill {num('prefill_tok_s', '.1f')} tok/s · "
            f"decode {num('decode_tok_s', '.1f')} tok/s · {stats.get('prompt_tokens', 0)} prompt + "
            f"{stats.get('generated_tokens', 0)} generated tokens · stop: {stop_reason}")


class ChatSession(QObject):
    replyStarted = Signal()
    promptProgress = Signal(int, int)  # done, total prompt tokens
    firstToken = Signal()
    textAppended = Signal(str)  # a printable piece of the reply being streamed
    replyFinished = Signal(object)  # the finished assistant Turn
    replyFailed = Signal(str)
    busyChanged = Signal(bool)
    changed = Signal()  # history replaced (clear, load)

    def __init__(self, client: EngineClient, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.client = client
        self.system_prompt = ""
        self.history: list[Turn] = []
        self.pending = ""  # text of the reply being streamed
        self.job: Job | None = None

    @property
    def busy(self) -> bool:
        return self.job is not None

    def messages(self) -> list[dict]:
        out = [{"role": "system", "content": self.system_prompt}] if self.system_prompt.strip() else []
        return out + [{"role": t.role, "content": t.content} for t in self.history if not t.error]

    def send(self, text: str, config: dict | None = None) -> Job | None:
        """Add a user turn and stream the reply; None when a reply is already streaming."""
        if self.busy or not text.strip():
            return None
        self.history.append(Turn("user", text))
        self.pending = ""
        job = self.client.submit(ChatRequest(messages=self.messages(), config=dict(config or {})))
        job.event.connect(self._on_event)
        job.finished.connect(self._on_finished)
        job.failed.connect(self._on_failed)
        self.job = job
        self.busyChanged.emit(True)
        self.replyStarted.emit()
        return job

    def stop(self) -> None:
        if self.job is not None:
            self.client.stop(self.job)

    def clear(self) -> None:
        self.stop()
        self.history.clear()
        self.changed.emit()

    def _on_event(self, event: dict) -> None:
        kind = event["kind"]
        if kind == "PrefillStarted":
            self.promptProgress.emit(0, event["prompt_tokens"])
        elif kind == "PrefillProgress":
            self.promptProgress.emit(event["done_tokens"], event["total_tokens"])
        elif kind == "PrefillFinished":
            self.promptProgress.emit(event["prompt_tokens"], event["prompt_tokens"])
        elif kind == "Token" and event.get("seq", 0) == 0:
            if event["index"] == 0:
                self.firstToken.emit()
            if event["text"]:
                self.pending += event["text"]
                self.textAppended.emit(event["text"])

    def _on_finished(self, result: dict) -> None:
        # Finished.text is authoritative (stop strings are already removed from it).
        text = result.get("text") or self.pending
        turn = Turn("assistant", text, result.get("stats"), result.get("stop_reason", ""))
        self._end(turn)
        self.replyFinished.emit(turn)

    def _on_failed(self, error_type: str, message: str) -> None:
        turn = Turn("assistant", self.pending, None, "error", error=f"{error_type}: {message}")
        self._end(turn)
        self.replyFailed.emit(message)

    def _end(self, turn: Turn) -> None:
        self.history.append(turn)
        self.job, self.pending = None, ""
        self.busyChanged.emit(False)

    # -- export ---------------------------------------------------------------------------------
    def to_markdown(self) -> str:
        lines = [f"**system:** {self.system_prompt}\n"] if self.system_prompt.strip() else []
        for turn in self.history:
            lines.append(f"**{turn.role}:** {turn.content}\n")
            if turn.role == "assistant" and (turn.stats or turn.error):
                lines.append(f"*{turn.error or format_stats(turn.stats, turn.stop_reason)}*\n")
        return "\n".join(lines)

    def to_json(self) -> str:
        turns = [{"role": t.role, "content": t.content, "stats": t.stats, "stop_reason": t.stop_reason,
                  "error": t.error} for t in self.history]
        return json.dumps({"system": self.system_prompt, "turns": turns}, indent=2)

    def save(self, path: str | Path) -> Path:
        """Save as JSON (``.json``) or Markdown (anything else)."""
        path = Path(path)
        path.write_text(self.to_json() if path.suffix.lower() == ".json" else self.to_markdown(),
                        encoding="utf-8")
        return path
