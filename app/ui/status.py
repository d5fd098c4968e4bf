"""The status bar: engine state, device, model, and memory in use (engine RSS, weights, VRAM).

A message on the left ("Loaded … in 812 ms", "Could not load …") is painted in the room the
permanent labels leave. So that it is never cut, the device and model labels give up width while
a message shows: they elide (the whole text stays in their tooltip) and take their room back when
it goes.
"""

from __future__ import annotations

import os

from opscope.app.ui.engine_client import EngineClient
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QSizePolicy, QStatusBar, QWidget

STATE_TEXT = {
    "stopped": "engine stopped",
    "starting": "engine starting…",
    "idle": "engine ready",
    "busy": "engine busy",
    "crashed": "engine crashed — restarts on the next request",
}


def format_bytes(n: float | None) -> str:
    if n is None:
        return "–"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


MIN_ELIDED_PX = 48  # an elided label keeps at least "devi…"
MESSAGE_GAP_PX = 16  # between the message and the first permanent label


class ElidedLabel(QLabel):
    """A one-line label that can be narrower than its text: it then ends in "…" (whole text in
    ``full_text`` and the tooltip)."""

    def __init__(self, text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.full_text = ""
        self.setSizePolicy(QSizePolicy.Preferred, QSizePolicy.Preferred)
        self.setText(text)

    def setText(self, text: str) -> None:
        self.full_text = text
        self._elide()
        self.updateGeometry()

    def sizeHint(self):
        hint = super().sizeHint()
        m = self.contentsMargins()
        hint.setWidth(
            self.fontMetrics().horizontalAdvance(self.full_text) + m.left() + m.right() + 2 * self.margin() + 4
        )
        return hint

    def minimumSizeHint(self):
        hint = super().minimumSizeHint()
        hint.setWidth(min(MIN_ELIDED_PX, self.sizeHint().width()))
        return hint

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._elide()

    def is_elided(self) -> bool:
        return super().text() != self.full_text

    def _elide(self) -> None:
        width = self.contentsRect().width() - 2 * self.margin() if self.isVisible() else 1 << 20
        fits = self.fontMetrics().horizontalAdvance(self.full_text) <= width - 4  # elidedText rounds down
        shown = (
            self.full_text if fits else self.fontMetrics().elidedText(self.full_text, Qt.ElideRight, max(width - 4, 0))
        )
        QLabel.setText(self, shown)


class EngineStatusBar(QStatusBar):
    def __init__(self, client: EngineClient, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("engineStatusBar")
        # A thin rule between the items, in either theme: "engine ready │ device: cpu │ model: …".
        self.setStyleSheet("QLabel#statusItem { border: none; border-left: 1px solid #a0aec0; padding: 0px 6px; }")
        self.state_label = QLabel(STATE_TEXT["stopped"])
        self.device_label = ElidedLabel("device: –")
        self.model_label = ElidedLabel("model: –")
        self.memory_label = QLabel("memory: –")
        for label in (self.state_label, self.device_label, self.model_label, self.memory_label):
            label.setObjectName("statusItem")
            self.addPermanentWidget(label)
        self.state_label.setToolTip("the engine worker: a separate process that runs every model job")
        client.stateChanged.connect(self.on_state)
        client.modelChanged.connect(self.on_model_changed)
        client.memory.connect(self.on_memory)
        self.messageChanged.connect(lambda _text: self.make_room())

    def on_state(self, state: str) -> None:
        self.state_label.setText(STATE_TEXT.get(state, state))
        self.make_room()

    def make_room(self) -> None:
        """Shrink the device and model labels just enough that the current message shows whole."""
        elastic = (self.device_label, self.model_label)
        message = self.currentMessage()
        need = self.fontMetrics().horizontalAdvance(message) + MESSAGE_GAP_PX if message else 0
        fixed = sum(w.sizeHint().width() for w in (self.state_label, self.memory_label))
        spacing = 6 * 5 + 3 + 24  # the layout's gaps and margins, and the size grip
        room = self.width() - need - fixed - spacing
        wanted = [w.sizeHint().width() for w in elastic]
        excess = sum(wanted) - room
        for label, width in zip(elastic, wanted):
            if excess > 0:  # each gives up in proportion to its width
                width = max(MIN_ELIDED_PX, width - excess * width // max(sum(wanted), 1))
            label.setMaximumWidth(width)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self.make_room()

    def on_model_changed(self, info: dict | None) -> None:
        """Name the model the engine holds now; after a failed load with nothing left, say so."""
        if info is None:
            self.model_label.setText("model: none loaded")
            self.model_label.setToolTip("the last load failed: see the notification; pick a model in the toolbar")
            self.device_label.setText("device: –")
            self.make_room()
            return
        self.on_model_loaded(info)

    def on_model_loaded(self, info: dict) -> None:
        fast = info.get("fastpath", "off")
        variant = f" {info['cpu_kernels']}" if info.get("cpu_kernels") else ""  # "avx2": the kernels' variant
        fast = f" · fast path{variant}{fast[2:]}" if fast.startswith("on") else ""  # "on (prefill_dtype=bf16)"
        # how the backend took the file's types ("Q4_K → MLX 4-bit g32: exact; Q6_K → ..."), when it converted
        conversion = f" · {info['conversion']}" if info.get("conversion") else ""
        self.device_label.setText(
            f"device: {info.get('device', '–')} · {info.get('dtype', '')}{fast} · {info.get('backend', '')}{conversion}"
        )
        explain = (
            "\nfast path: the GGUF's quantized weights with OpScope's CPU kernels "
            f"({info['cpu_kernels'] + ' variant, ' if variant else ''}benchmarks/FASTPATH_NOTES.md)"
            if fast
            else ""
        )
        self.device_label.setToolTip(self.device_label.full_text + explain)  # whole, when elided
        name = os.path.basename(info.get("path", "")) or "–"
        self.model_label.setText(f"model: {name}")
        self.model_label.setToolTip(info.get("path", ""))
        self.make_room()

    def on_memory(self, stats: dict) -> None:
        parts = [f"engine RSS {format_bytes(stats.get('rss_bytes'))}"]
        if stats.get("weights_bytes") is not None:
            parts.append(f"weights {format_bytes(stats['weights_bytes'])}")
        vram = stats.get("cuda_allocated_bytes", stats.get("active_bytes"))
        if vram is not None:
            parts.append(f"VRAM {format_bytes(vram)}")
        self.memory_label.setText(" · ".join(parts))
        self.make_room()
