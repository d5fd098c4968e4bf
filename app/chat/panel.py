"""The Chat panel: a view over ChatSession (transcript, input, sampling controls, per-reply stats).

Replies render as Markdown while they stream (app.chat.transcript); the stats line under the
transcript shows TTFT from the first token on and tokens and tok/s as they arrive, then the final
stats. A message that has to wait for another engine job says what it waits for.
"""

from __future__ import annotations

import json

from opscope.app.chat.session import ChatSession, Turn, format_stats
from opscope.app.chat.transcript import ChatTranscript
from opscope.app.ui import settings
from opscope.app.ui.notify import export_guard
from opscope.app.ui.widgets import shrinkable
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication, QKeySequence, QPalette, QShortcut
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

# Prompt tokens per forward pass: small enough that a long conversation shows prompt progress
# moving, large enough that the extra passes cost little.
PREFILL_CHUNK = 128
EMPTY_HINT = (
    "<p style='color:#718096'><i>Ask the model something below and press Ctrl+Enter. "
    "Each reply shows its time to first token, prefill and decode speed, and why it stopped."
    "</i></p>"
)


PRESETS = {  # LM Studio-like starting points; any edit makes the settings "Custom"
    "Precise": {"temperature": 0.2, "top_k": 20, "top_p": 0.9, "min_p": 0.05, "repetition_penalty": 1.1},
    "Balanced": {"temperature": 0.7, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repetition_penalty": 1.1},
    "Creative": {"temperature": 1.1, "top_k": 100, "top_p": 0.98, "min_p": 0.02, "repetition_penalty": 1.05},
    "Greedy": {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0},
}
CUSTOM = "Custom"


class SamplingForm(QGroupBox):
    """Sampling controls and presets → a dict of engine.generate.GenerationConfig fields (persisted)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Sampling", parent)
        self.preset = QComboBox()
        self.preset.addItems([*PRESETS, CUSTOM])
        self.preset.setToolTip(
            "Precise: focused and repeatable · Balanced: the default · Creative: more varied · "
            "Greedy: always the most likely token · Custom: your own values"
        )
        self.max_tokens = _spin(QSpinBox(suffix=" tokens"), 1, 4096, 128)
        self.temperature = _spin(QDoubleSpinBox(singleStep=0.1, decimals=2), 0.0, 5.0, 0.7)
        self.top_k = _spin(QSpinBox(), 0, 1000, 40)
        self.top_p = _spin(QDoubleSpinBox(singleStep=0.05, decimals=2), 0.01, 1.0, 0.95)
        self.min_p = _spin(QDoubleSpinBox(singleStep=0.01, decimals=2), 0.0, 0.99, 0.05)
        self.repetition_penalty = _spin(QDoubleSpinBox(singleStep=0.05, decimals=2), 0.5, 2.0, 1.1)
        self.seed = _spin(QSpinBox(specialValueText="random"), -1, 2**31 - 1, -1)
        self.stop_strings = QLineEdit(placeholderText="e.g. User:|\\n\\n", clearButtonEnabled=True)
        self.stop_strings.setToolTip(
            "Stop the reply at any of these strings: separate several with |, write a line break as \\n"
        )
        self.ignore_eos = QCheckBox(
            "ignore", toolTip="Generate max tokens even past the model's end-of-text token (fixed-length measurements)"
        )
        self.reuse_prefix = QCheckBox(
            "reuse",
            checked=True,
            toolTip="Reuse the KV cache of the conversation so far: each turn prefills only what is new",
        )
        self.prefill_chunk = _spin(QSpinBox(suffix=" tokens", singleStep=64), 1, 8192, PREFILL_CHUNK)
        self.prefill_chunk.setToolTip("Prompt tokens per forward pass while prefilling (smaller: finer progress)")
        self.temperature.setToolTip("0 = greedy (deterministic)")
        self.top_k.setSpecialValueText("off")
        form = QFormLayout(self)
        form.addRow("Preset", self.preset)
        for label, widget in (
            ("Max tokens", self.max_tokens),
            ("Temperature", self.temperature),
            ("Top-k", self.top_k),
            ("Top-p", self.top_p),
            ("Min-p", self.min_p),
            ("Repetition penalty", self.repetition_penalty),
            ("Seed", self.seed),
            ("Stop at", self.stop_strings),
            ("End of text", self.ignore_eos),
            ("Prompt cache", self.reuse_prefix),
            ("Prefill chunk", self.prefill_chunk),
        ):
            form.addRow(label, widget)
        self._restore()
        self.preset.currentTextChanged.connect(self.apply_preset)
        for widget in self._sampling_widgets().values():
            widget.valueChanged.connect(self._on_edited)
        for widget in (self.max_tokens, self.seed, self.prefill_chunk):
            widget.valueChanged.connect(lambda _v: self._save())
        self.stop_strings.editingFinished.connect(self._save)
        for box in (self.ignore_eos, self.reuse_prefix):
            box.toggled.connect(lambda _b: self._save())

    def _sampling_widgets(self) -> dict:
        return {
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "min_p": self.min_p,
            "repetition_penalty": self.repetition_penalty,
        }

    def apply_preset(self, name: str) -> None:
        if name in PRESETS:
            self._applying = True
            for key, widget in self._sampling_widgets().items():
                widget.setValue(PRESETS[name][key])
            self._applying = False
        self._save()

    def _on_edited(self, _value=None) -> None:
        if getattr(self, "_applying", False):
            return
        values = {k: w.value() for k, w in self._sampling_widgets().items()}
        match = next((n for n, p in PRESETS.items() if all(abs(values[k] - v) < 1e-9 for k, v in p.items())), CUSTOM)
        self.preset.blockSignals(True)
        self.preset.setCurrentText(match)
        self.preset.blockSignals(False)
        self._save()

    def _save(self) -> None:
        settings.set_value("chat/sampling", json.dumps({"preset": self.preset.currentText(), **self.config()}))

    def _restore(self) -> None:
        try:
            saved = json.loads(str(settings.value("chat/sampling", "") or "{}"))
        except ValueError:
            saved = {}
        widgets = {**self._sampling_widgets(), "max_tokens": self.max_tokens, "prefill_chunk": self.prefill_chunk}
        for key, widget in widgets.items():
            if isinstance(saved.get(key), (int, float)):
                widget.setValue(saved[key])
        if isinstance(saved.get("seed"), int):
            self.seed.setValue(saved["seed"])
        if isinstance(saved.get("stop"), list):
            self.stop_strings.setText("|".join(s.replace("\n", "\\n") for s in saved["stop"]))
        for key, box in (("ignore_eos", self.ignore_eos), ("reuse_prefix", self.reuse_prefix)):
            if isinstance(saved.get(key), bool):
                box.setChecked(saved[key])
        self.preset.setCurrentText(saved.get("preset") if saved.get("preset") in (*PRESETS, CUSTOM) else "Balanced")

    def config(self) -> dict:
        seed = self.seed.value()
        return {
            "max_tokens": self.max_tokens.value(),
            "temperature": self.temperature.value(),
            "top_k": self.top_k.value(),
            "top_p": self.top_p.value(),
            "min_p": self.min_p.value(),
            "repetition_penalty": self.repetition_penalty.value(),
            "seed": None if seed < 0 else seed,
            "stop": self.stops(),
            "ignore_eos": self.ignore_eos.isChecked(),
            "reuse_prefix": self.reuse_prefix.isChecked(),
            "prefill_chunk": self.prefill_chunk.value(),
        }

    def stops(self) -> list[str]:
        """The stop strings typed, ``|``-separated, with ``\\n`` read as a line break."""
        return [p.replace("\\n", "\n") for p in self.stop_strings.text().split("|") if p]


def _spin(widget, low, high, value):
    widget.setRange(low, high)
    widget.setValue(value)
    return widget


class ChatPanel(QWidget):
    def __init__(self, session: ChatSession, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.session = session
        self.transcript = ChatTranscript()
        self._rendered_base: int | None = None  # the palette's Base colour the transcript was rendered in
        self.transcript.paletteChanged.connect(self._render_if_palette_changed, Qt.QueuedConnection)
        self.input = QPlainTextEdit(placeholderText="Message the model…  (Ctrl+Enter sends)")
        self.input.setMaximumHeight(90)
        self.send_button = QPushButton("Send", objectName="primary", clicked=self.send)
        self.stop_button = QPushButton("Stop", objectName="danger", clicked=session.stop, enabled=False)
        self.regenerate_button = QPushButton(
            "Regenerate", clicked=self.regenerate, enabled=False, toolTip="Ask again for the last reply (Ctrl+R)"
        )
        self.edit_button = QPushButton(
            "Edit last",
            clicked=self.edit_last,
            enabled=False,
            toolTip="Take the last message back into the input to change it (Ctrl+E)",
        )
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
        tools = [
            QPushButton(text, clicked=slot)
            for text, slot in (("Copy", self.copy), ("Save…", self.save_dialog), ("Clear", self.session.clear))
        ]
        for button in tools:
            buttons.addWidget(button)
        shrinkable(*tools, self.edit_button, self.regenerate_button, self.stop_button, self.send_button)
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
        # The settings column scrolls: its thirteen rows must not make the window taller than 640 px.
        scroll = QScrollArea(widgetResizable=True, frameShape=QFrame.NoFrame)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        scroll.setWidget(right)
        scroll.setMinimumWidth(right.minimumSizeHint().width() + scroll.verticalScrollBar().sizeHint().width())
        splitter = QSplitter(Qt.Horizontal)
        splitter.addWidget(left)
        splitter.addWidget(scroll)
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
        s.changed.connect(self._show_last_stats)
        self.system_prompt.textChanged.connect(lambda: setattr(s, "system_prompt", self.system_prompt.toPlainText()))

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
        path, _ = QFileDialog.getSaveFileName(
            self, "Save conversation", "conversation.md", "Markdown (*.md);;JSON (*.json)"
        )
        if path:
            with export_guard(self, "save the conversation", path):
                self.session.save(path)

    # -- rendering ------------------------------------------------------------------------------
    # The transcript bakes the palette into code tints and footers when it renders: after a theme
    # switch it renders again, or light code blocks stay under the dark theme's light text.
    def _render_if_palette_changed(self) -> None:
        rendered = getattr(self, "_rendered_base", None)  # palette events also arrive during __init__
        if rendered is not None and self.transcript.palette().color(QPalette.Base).rgb() != rendered:
            self.render()

    def render(self) -> None:
        self._rendered_base = self.transcript.palette().color(QPalette.Base).rgb()
        self.transcript.show_turns(
            self.session.history, lambda turn: _footer(turn, self.session.model_name), EMPTY_HINT
        )
        if self.session.busy:
            self.transcript.begin_stream()
            self.transcript.stream(self.session.pending)

    def _on_started(self) -> None:
        self.render()
        self.stats_label.setText("")
        self._show_busy("Processing prompt…")  # until the engine reports prompt progress

    def _on_waiting(self, reason: str) -> None:
        self._show_busy(f"{reason[:1].upper()}{reason[1:]}…" if reason else "Processing prompt…")

    def _show_busy(self, text: str) -> None:
        # An empty determinate bar, not a busy one (range 0..0): Fusion draws no text on a busy
        # bar, and the text is what says what the engine is doing.
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.progress.setFormat(text)
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
        # the whole energy source (why N/A, or which counter): the line shows only its first clause
        self.stats_label.setToolTip(f"energy: {(turn.stats or {}).get('energy_source') or 'not measured'}")
        self.render()

    def _show_last_stats(self) -> None:
        """The stats line describes the reply the transcript ends with: Edit last and Clear remove
        it, and its figures with it."""
        if self.session.busy:
            return
        last = self.session.history[-1] if self.session.history else None
        if last is None or last.role != "assistant":
            self.stats_label.setText("")
            self.stats_label.setToolTip("")
        else:
            self.stats_label.setText(_footer(last, self.session.model_name)[0])

    def _on_busy(self, busy: bool) -> None:
        self.send_button.setEnabled(not busy)
        self.stop_button.setEnabled(busy)
        self._update_actions()

    def _update_actions(self) -> None:
        has_user = any(t.role == "user" for t in self.session.history)
        self.regenerate_button.setEnabled(has_user and not self.session.busy)
        self.edit_button.setEnabled(has_user and not self.session.busy)


def _footer(turn: Turn, loaded: str = "") -> tuple[str, bool]:
    """The line under a reply: its stats, or why it failed; and which model wrote it once another
    model is loaded (the conversation stays on screen across a model switch)."""
    text = turn.error or format_stats(turn.stats, turn.stop_reason)
    writer = turn.extra.get("model", "")
    if writer and writer != loaded:
        text += f" · written by {writer}, not the model loaded now"
    return text, bool(turn.error)
