"""The Chat panel's model: a multi-turn conversation streamed from the engine worker.

Views subscribe to the signals; nothing here touches a widget. The whole history (plus the system
prompt) goes to the worker on every turn and the engine renders it with the model's chat template.
While a reply streams, ``liveStats`` carries TTFT, tokens and tok/s computed from the streamed
events with the engine's own ``stats_from_times``: the numbers the final ``Finished`` event reports,
by construction. A message that has to wait for another engine job says which (``waiting``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from opscope.app.ui.engine_client import EngineClient, Job
from opscope.app.worker.protocol import ChatRequest
from opscope.engine import stats_from_times
from PySide6.QtCore import QObject, Signal

# What a queued chat message waits for, by the kind of the job ahead of it.
WAIT_TEXT = {
    "load": "waiting for the model to load",
    "bench": "waiting for the benchmark to finish",
    "trace": "waiting for the trace to finish",
    "chat": "waiting for the previous reply",
    "generate": "waiting for a generation to finish",
    "info": "waiting for the engine to start",
    "debug": "waiting for a debug request",
    "roofline": "waiting for a roofline to be computed",
}


@dataclass
class Turn:
    role: str  # "user" | "assistant"
    content: str
    stats: dict | None = None  # engine.events.GenerationStats.as_dict() for assistant replies
    stop_reason: str = ""
    error: str = ""
    extra: dict = field(default_factory=dict)


def format_stats(stats: dict | None, stop_reason: str, *, live: bool = False) -> str:
    """One line a person reads: TTFT, prefill tok/s, decode tok/s, tokens, stop reason (or, while
    the reply streams, that it is still generating)."""
    if not stats:
        return f"stop: {stop_reason}" if stop_reason else ""

    def num(key: str, fmt: str) -> str:
        value = stats.get(key)
        return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, fmt)

    end = "generating…" if live else f"stop: {stop_reason}"
    generated = stats.get("generated_tokens", 0)
    if not stats.get("cached_tokens"):
        return (
            f"TTFT {num('ttft_ms', '.0f')} ms · prefill {num('prefill_tok_s', '.1f')} tok/s · "
            f"decode {num('decode_tok_s', '.1f')} tok/s · {stats.get('prompt_tokens', 0)} prompt + "
            f"{generated} generated tokens{_energy(stats, num)} · {end}"
        )
    return (
        f"TTFT {num('ttft_ms', '.0f')} ms · {_cached_prefill(stats, num)} · decode {num('decode_tok_s', '.1f')} "
        f"tok/s · {generated} generated tokens{_energy(stats, num)} · {end}"
    )


# Below this many prefilled (not cached) tokens a prefill rate measures the step's fixed cost, not
# a throughput: 1 token over one 1.8 s step read "prefill 0.6 tok/s".
RATE_MIN_TOKENS = 32


def _cached_prefill(stats: dict, num) -> str:
    """ "prefill 200 tok (180 cached)", with the rate over the prefilled ones where there are enough."""
    prompt, cached = stats.get("prompt_tokens", 0), stats["cached_tokens"]
    rate = f", {num('prefill_tok_s', '.1f')} tok/s" if prompt - cached >= RATE_MIN_TOKENS else ""
    return f"prefill {prompt} tok ({cached} cached){rate}"


def _energy(stats: dict, num) -> str:
    """J/token of prefill and decode (engine.energy), or "energy N/A" where no counter is readable."""
    source = stats.get("energy_source")
    if not source:
        return ""
    if source.startswith("N/A"):
        from opscope.engine import energy_short_reason as short_reason

        return f" · energy N/A ({short_reason(source)})"
    return f" · {num('prefill_j_per_token', '.3g')} J/tok prefill, {num('decode_j_per_token', '.3g')} J/tok decode"


class LiveTimes:
    """The timestamps of the reply being streamed, turned into stats exactly as the engine does."""

    def __init__(self) -> None:
        self.request_ns = self.prefill_start_ns = self.prefill_end_ns = 0
        self.prompt_tokens = self.cached_tokens = 0
        self.token_ns: list[int] = []

    def on_event(self, event: dict) -> bool:
        """Take one streamed event; True when the stats changed (a token of sequence 0 arrived)."""
        kind = event["kind"]
        if kind == "PrefillStarted":
            self.request_ns, self.prefill_start_ns = event["request_t_ns"], event["t_ns"]
            self.prompt_tokens = event["prompt_tokens"]
            self.cached_tokens = event.get("cached_tokens", 0)  # reused from the engine's KV cache
        elif kind == "PrefillFinished":
            self.prefill_end_ns, self.prompt_tokens = event["t_ns"], event["prompt_tokens"]
        elif kind == "Token" and event.get("seq", 0) == 0:
            self.token_ns.append(event["t_ns"])
            return True
        return False

    def stats(self) -> dict | None:
        """GenerationStats.as_dict() as of the last token (None before the first one)."""
        if not self.token_ns:
            return None
        prefill_end = self.prefill_end_ns or self.token_ns[0]
        return stats_from_times(
            self.request_ns,
            self.prefill_start_ns,
            prefill_end,
            self.prompt_tokens,
            self.token_ns,
            self.token_ns[-1],
            self.cached_tokens,
        ).as_dict()


class ChatSession(QObject):
    replyStarted = Signal()
    promptProgress = Signal(int, int)  # done, total prompt tokens
    firstToken = Signal()
    textAppended = Signal(str)  # a printable piece of the reply being streamed
    liveStats = Signal(dict)  # GenerationStats.as_dict() as of the latest token
    waiting = Signal(str)  # what the queued message waits for ("" once the engine runs it)
    replyFinished = Signal(object)  # the finished assistant Turn
    replyFailed = Signal(str)
    busyChanged = Signal(bool)
    changed = Signal()  # history replaced (clear, load)

    def __init__(self, client: EngineClient, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.client = client
        self.system_prompt = ""
        self.context_length = 0  # tokens the worker fits the conversation into; 0 = the model's limit
        self.history: list[Turn] = []
        self.pending = ""  # text of the reply being streamed
        self.job: Job | None = None
        self.times = LiveTimes()
        self.model_name = ""  # the file the worker holds now: each reply records the one that wrote it
        if client is not None:
            client.modelChanged.connect(self._on_model_changed)

    def _on_model_changed(self, info: dict | None) -> None:
        """A reply written by another model says so once the model changes (views render again)."""
        name = Path(str(info.get("path", ""))).name if info else ""
        if name != self.model_name:
            self.model_name = name
            if any(t.role == "assistant" for t in self.history):
                self.changed.emit()

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
        return self._submit(config)

    def regenerate(self, config: dict | None = None) -> Job | None:
        """Drop the last reply and ask again with the same history; None when there is nothing to redo."""
        if self.busy or not self.history:
            return None
        if self.history[-1].role == "assistant":
            self.history.pop()
        if not self.history or self.history[-1].role != "user":
            return None
        self.changed.emit()
        return self._submit(config)

    def take_last_message(self) -> str | None:
        """Remove the last user message (and the reply to it) and return its text to be edited."""
        if self.busy:
            return None
        index = next((i for i in range(len(self.history) - 1, -1, -1) if self.history[i].role == "user"), None)
        if index is None:
            return None
        text = self.history[index].content
        del self.history[index:]
        self.changed.emit()
        return text

    def _submit(self, config: dict | None) -> Job:
        self.pending, self.times = "", LiveTimes()
        job = self.client.submit(
            ChatRequest(messages=self.messages(), config=dict(config or {}), context_length=self.context_length)
        )
        job.event.connect(self._on_event)
        job.finished.connect(self._on_finished)
        job.failed.connect(self._on_failed)
        job.started.connect(lambda: self.waiting.emit(""))
        self.client.jobsChanged.connect(self._check_waiting)
        self.job = job
        self.busyChanged.emit(True)
        self.replyStarted.emit()
        self._check_waiting()
        return job

    def wait_reason(self) -> str:
        """What the message being sent waits for; "" when the engine is on it (or nothing is sent)."""
        if self.job is None or self.job.running:
            return ""
        if self.client.state == "starting":
            return "waiting for the engine to start"
        ahead = self.client.ahead_of(self.job)
        return WAIT_TEXT.get(ahead.kind, f"waiting for {ahead.kind} to finish") if ahead is not None else ""

    def _check_waiting(self) -> None:
        if self.job is not None and not self.job.running:
            self.waiting.emit(self.wait_reason())

    def stop(self) -> None:
        if self.job is not None:
            self.client.stop(self.job)

    def clear(self) -> None:
        self.stop()
        self.history.clear()
        self.changed.emit()

    def _on_event(self, event: dict) -> None:
        kind = event["kind"]
        if kind == "PrefillStarted":  # tokens reused from the engine's KV cache count as done
            self.promptProgress.emit(event.get("cached_tokens", 0), event["prompt_tokens"])
        elif kind == "PrefillProgress":
            self.promptProgress.emit(event["done_tokens"], event["total_tokens"])
        elif kind == "PrefillFinished":
            self.promptProgress.emit(event["prompt_tokens"], event["prompt_tokens"])
        if self.times.on_event(event):
            if event["index"] == 0:
                self.firstToken.emit()
            if event["text"]:
                self.pending += event["text"]
                self.textAppended.emit(event["text"])
            self.liveStats.emit(self.times.stats())

    def _on_finished(self, result: dict) -> None:
        # Finished.text is authoritative (stop strings are already removed from it).
        text = result.get("text") or self.pending
        turn = Turn(
            "assistant", text, result.get("stats"), result.get("stop_reason", ""), extra={"model": self.model_name}
        )
        self._end(turn)
        self.replyFinished.emit(turn)

    def _on_failed(self, error_type: str, message: str) -> None:
        turn = Turn("assistant", self.pending, None, "error", error=message or error_type)
        self._end(turn)
        self.replyFailed.emit(message)

    def _end(self, turn: Turn) -> None:
        if self.job is not None:
            self.client.jobsChanged.disconnect(self._check_waiting)
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
        turns = [
            {"role": t.role, "content": t.content, "stats": t.stats, "stop_reason": t.stop_reason, "error": t.error}
            for t in self.history
        ]
        return json.dumps({"system": self.system_prompt, "turns": turns}, indent=2)

    def save(self, path: str | Path) -> Path:
        """Save as JSON (``.json``) or Markdown (anything else)."""
        path = Path(path)
        path.write_text(self.to_json() if path.suffix.lower() == ".json" else self.to_markdown(), encoding="utf-8")
        return path
