"""The status bar: engine state, device, model, and memory in use (engine RSS, weights, VRAM)."""
from __future__ import annotations

import os

from PySide6.QtWidgets import QLabel, QStatusBar, QWidget

from opscope.app.engine_client import EngineClient

STATE_TEXT = {"stopped": "engine stopped", "starting": "engine starting…", "idle": "engine ready",
              "busy": "engine busy", "crashed": "engine crashed — restarts on the next request"}


def format_bytes(n: float | None) -> str:
    if n is None:
        return "–"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


class EngineStatusBar(QStatusBar):
    def __init__(self, client: EngineClient, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.state_label = QLabel(STATE_TEXT["stopped"])
        self.device_label = QLabel("device: –")
        self.model_label = QLabel("model: –")
        self.memory_label = QLabel("memory: –")
        for label in (self.state_label, self.device_label, self.model_label, self.memory_label):
            self.addPermanentWidget(label)
        client.stateChanged.connect(lambda s: self.state_label.setText(STATE_TEXT.get(s, s)))
        client.modelChanged.connect(self.on_model_changed)
        client.memory.connect(self.on_memory)

    def on_model_changed(self, info: dict | None) -> None:
        """Name the model the engine holds now; after a failed load with nothing left, say so."""
        if info is None:
            self.model_label.setText("model: none loaded")
            self.model_label.setToolTip("the last load failed: see the notification; pick a model in the toolbar")
            self.device_label.setText("device: –")
            return
        self.on_model_loaded(info)

    def on_model_loaded(self, info: dict) -> None:
        fast = info.get("fastpath", "off")
        fast = f" · fast path{fast[2:]}" if fast.startswith("on") else ""  # "on (prefill_dtype=bf16)"
        self.device_label.setText(f"device: {info.get('device', '–')} · {info.get('dtype', '')}{fast}"
                                  f" · {info.get('backend', '')}")
        self.device_label.setToolTip("fast path: the GGUF's quantized weights with OpScope's CPU kernels "
                                     "(benchmarks/FASTPATH_NOTES.md)" if fast else "")
        name = os.path.basename(info.get("path", "")) or "–"
        self.model_label.setText(f"model: {name}")
        self.model_label.setToolTip(info.get("path", ""))

    def on_memory(self, stats: dict) -> None:
        parts = [f"engine RSS {format_bytes(stats.get('rss_bytes'))}"]
        if stats.get("weights_bytes") is not None:
            parts.append(f"weights {format_bytes(stats['weights_bytes'])}")
        vram = stats.get("cuda_allocated_bytes", stats.get("active_bytes"))
        if vram is not None:
            parts.append(f"VRAM {format_bytes(vram)}")
        self.memory_label.setText(" · ".join(parts))
