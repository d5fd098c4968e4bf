"""The Chat panel: a view over ChatSession (transcript, input, sampling controls, per-reply stats).

Replies render as Markdown while they stream (app.chat.transcript); the stats line under the
transcript shows TTFT from the first token on and tokens and tok/s as they arrive, then the final
stats. A message that has to wait for another engine job says what it waits for.
"""
from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication, QKeySequence, QShortcut
from PySide6.QtWidgets import (QDoubleSpinBox, QFileDialog, QFormLayout, QGroupBox, QHBoxLayout, QLabel,
                               QPlainTextEdit, QProgressBar, QPushButton, QSpinBox, QSplitter,
                               QVBoxLayout, QWidget)

from app.chat.session import ChatSession, Turn, format_stats
from app.chat.transcript import ChatTranscript
from app.notify import export_guard

# Prompt tokens per forward pass: small enough that a long conversation shows prompt progress
# moving, large enough that the extra passes cost little.
PREFILL_CHUNK = 128
EMPTY_HINT = ("<p style='color:#718096'><i>Ask the model something below and press Ctrl+Enter. "
              "Each reply shows its time to first token, prefill and decode speed, and why it stopped."
              "</i></p>")


class SamplingForm(QGroupBox):
    """Sampling controls → a dict of engine.generate.GenerationConfig fields."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Sampling", parent)
        self.max_tokens = _spin(QSpinBox(), 1, 4096, 128)
        self.temperature = _spin(QDoubleSpinBox(singleStep=0.1, decimals=2), 0.0, 5.0, 0.7)
        self.top_k = _spin(QSpinBox(), 0, 1000, 40)
        self.top_p = _spin(QDoubleSpinBox(singleStep=0.05, decimals=2), 0.01, 1.0, 0.95)
        self.min_p = _spin(QDoubleSpinBox(singleStep=0.01, decimals=2), 0.0, 0.99, 0.05)
        self.repetition_penalty = _spin(QDoubleSpinBox(singleStep=0.05, decimals=2), 0.5, 2.0, 1.1)
        self.seed = _spin(QSpinBox(specialValueText="random"), -1, 2**31 - 1, -1)
        self.temperature.setToolTip("0 = greedy (deterministic)")
        form = QFormLayout(self)
        for label, widget in (("Max tokens", self.max_tokens), ("Temperature", self.temperature),
                              ("Top-k", self.top_k), ("Top-p", self.top_p), ("Min-p", self.min_p),
                              ("Repetition penalty", self.repetition_penalty), ("Seed", self.seed)):
            form.addRow(label, widget)

    def config(self) -> dict:
        seed = self.seed.value()
        return {"max_tokens": self.max_tokens.value(), "temperature": self.temperature.value(),
                "top_k": self.top_k.value(), "top_p": self.top_p.value(), "min_p": self.min_p.value(),
                "repetition_penalty": self.repetition_penalty.value(), "seed": None if seed < 0 else seed,
                "prefill_chunk": PREFILL_CHUNK}


def _spin(widget, low, high, value):
    widget.setRange(low, high)
    widget.setValue(value)
    return widget


class ChatPanel(QWidget):
    def __init__(self, session: ChatSession, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.session = session
        self.transcript = ChatTranscript()
        self.input = QPlainTextEdit(placeholderText="Message the model…  (Ctrl+Enter sends)")
        self.input.setMaximumHeight(90)
        self.send_button = QPushButton("Send", objectName="primary", clicked=self.send)
        self.stop_button = QPushButton("Stop", objectName="danger", clicked=session.stop, enabled=False)
        self.regenerate_button = QPushButton("Regenerate", clicked=self.regenerate, enabled=False,
                                             toolTip="Ask again for the last reply (Ctrl+R)")
        self.edit_button = QPushButton("Edit last", clicked=self.edit_last, enabled=False,
                                       toolTip="Take the last message back into the input to change it (Ctrl+E)")
        self.progress = QProgressBar(visible=False, textVisible=True)
        self.stats_label = QLabel(objectName="statsLine", wordWrap=True)
        self.system_prompt = QPlainTextEdit(placeholderText="e.g. You are a concise assistant.")
        self.system_prompt.setMaximumHeight(110)
        self.sampling = SamplingForm()
        self._build()
        self._connect()
        self.render()

    def _build(self) -> None:
        buttons = QHBoxLayout()
        for text, slot in (("Copy", self.copy), ("Save…", self.save_dialog), ("Clear", self.session.clear)):
            buttons.addWidget(QPushButton(text, clicked=slot))
        buttons.addStretch(1)
        buttons.addWidget(self.edit_button)
        buttons.addWidget(self.regenerate_button)
        buttons.addWidget(self.stop_button)
        buttons.addWidget(self.send_button)
        left = QWidget()
        col = QVBoxLayout(left)
        col.setContentsMargins(0, 0, 0, 0)
        for widget in (self.transcript, self.progress, self.stats_label, self.input):
            col.addWidget(widget, 1 if widget is self.transcript else 0)
        col.addLayout(buttons)
        right = QWidget()
        side = QVBoxLayout(right)
        side.setContentsMargins(0, 0, 0, 0)
        box = QGroupBox("System prompt")
        QVBoxLayout(box).addWidget(self.system_prompt)
        side.addWidget(box)
        side.addWidget(self.sampling)
        side.addStretch(1)
        splitter = QSplitter(Qt.Horizontal)
        splitter.addWidget(left)
        splitter.addWidget(right)
        splitter.setStretchFactor(0, 3)
        splitter.setStretchFactor(1, 1)
        QVBoxLayout(self).addWidget(splitter)
        QShortcut(QKeySequence("Ctrl+Return"), self.input, activated=self.send)
        QShortcut(QKeySequence("Ctrl+R"), self, activated=self.regenerate, context=Qt.WidgetWithChildrenShortcut)
        QShortcut(QKeySequence("Ctrl+E"), self, activated=self.edit_last, context=Qt.WidgetWithChildrenShortcut)

    def _connect(self) -> None:
        s = self.session
        s.replyStarted.connect(self._on_started)
        s.promptProgress.connect(self._on_progress)
        s.firstToken.connect(lambda: self.progress.setVisible(False))
        s.textAppended.connect(lambda _piece: self.transcript.stream(s.pending))
        s.liveStats.connect(self._on_live_stats)
        s.waiting.connect(self._on_waiting)
        s.replyFinished.connect(self._on_finished)
        s.replyFailed.connect(lambda _msg: self._on_finished(s.history[-1]))
        s.busyChanged.connect(self._on_busy)
        s.changed.connect(self.render)
        s.changed.connect(self._update_actions)
        self.system_prompt.textChanged.connect(
            lambda: setattr(s, "system_prompt", self.system_prompt.toPlainText()))

    def send(self) -> None:
        text = self.input.toPlainText()
        if self.session.send(text, self.sampling.config()) is not None:
            self.input.clear()

    def regenerate(self) -> None:
        self.session.regenerate(self.sampling.config())

    def edit_last(self) -> None:
        text = self.session.take_last_message()
        if text is not None:
            self.input.setPlainText(text)
            self.input.setFocus()

    def copy(self) -> None:
        QGuiApplication.clipboard().setText(self.session.to_markdown())

    def save_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Save conversation", "conversation.md",
                                              "Markdown (*.md);;JSON (*.json)")
        if path:
            with export_guard(self, "save the conversation", path):
                self.session.save(path)

    # -- rendering ------------------------------------------------------------------------------
    def render(self) -> None:
        self.transcript.show_turns(self.session.history, _footer, EMPTY_HINT)
        if self.session.busy:
            self.transcript.begin_stream()
            self.transcript.stream(self.session.pending)

    def _on_started(self) -> None:
        self.render()
        self.stats_label.setText("")
        self.progress.setRange(0, 0)  # busy until the engine reports prompt progress
        self.progress.setFormat("Processing prompt…")
        self.progress.setVisible(True)

    def _on_waiting(self, reason: str) -> None:
        self.progress.setRange(0, 0)
        self.progress.setFormat(f"{reason[:1].upper()}{reason[1:]}…" if reason else "Processing prompt…")
        self.progress.setVisible(True)

    def _on_live_stats(self, stats: dict) -> None:
        if stats.get("generated_tokens") == 1:
            self.transcript.flush()  # the first token shows at once, with its TTFT
        self.stats_label.setText(format_stats(stats, "", live=True))

    def _on_progress(self, done: int, total: int) -> None:
        self.progress.setRange(0, max(total, 1))
        self.progress.setValue(done)
        self.progress.setFormat(f"Processing prompt: {done}/{total} tokens")

    def _on_finished(self, turn: Turn) -> None:
        self.progress.setVisible(False)
        self.stats_label.setText(turn.error or format_stats(turn.stats, turn.stop_reason))
        self.render()

    def _on_busy(self, busy: bool) -> None:
        self.send_button.setEnabled(not busy)
        self.stop_button.setEnabled(busy)
        self._update_actions()

    def _update_actions(self) -> None:
        has_user = any(t.role == "user" for t in self.session.history)
        self.regenerate_button.setEnabled(has_user and not self.session.busy)
        self.edit_button.setEnabled(has_user and not self.session.busy)


def _footer(turn: Turn) -> tuple[str, bool]:
    """The line under a reply: its stats, or why it failed."""
    return turn.error or format_stats(turn.stats, turn.stop_reason), bool(turn.error)
