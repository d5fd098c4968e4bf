"""The model toolbar: model (embedded default, recent files, Open…), backend, device and dtype.

Backends and devices come from the engine worker (InfoRequest), so the GUI never imports torch.
Unavailable devices stay listed, greyed out, with the reason as their tooltip. Any change asks for
a load through ``loadRequested``. The window calls ``show_model`` with what is being loaded and then
with what the worker actually holds, so after a failed load the box goes back to the model in use
(or says that none is loaded); a file joins the recent models only once it has loaded.
"""

from __future__ import annotations

import os

from opscope.app.ui import settings
from opscope.app.worker.protocol import LoadRequest
from PySide6.QtCore import Signal
from PySide6.QtWidgets import QComboBox, QFileDialog, QLabel, QToolBar, QToolButton, QWidget

DEFAULT_LABEL = "Embedded default · SmolLM2-135M-Instruct Q4_1"
NO_MODEL_LABEL = "No model loaded"
OPEN_FILE = "__open__"
NO_MODEL = "__none__"


class ModelToolBar(QToolBar):
    loadRequested = Signal(object)  # LoadRequest
    settingsRequested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Model", parent)
        self.setObjectName("modelToolBar")
        self.model_combo = QComboBox(minimumContentsLength=28)
        self.backend_combo = QComboBox()
        self.device_combo = QComboBox(minimumContentsLength=8)
        # Unavailable devices carry their reason in the item text: the popup shows it in full,
        # the closed combo must not grow to fit it.
        self.device_combo.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        self.dtype_combo = QComboBox()
        self.dtype_combo.addItems(["float32", "bfloat16", "float16"])
        self._backends: list[dict] = []
        self._shown: LoadRequest | None = None  # the spec show_model last showed
        self._updating = False
        for label, combo in (
            ("Model ", self.model_combo),
            (" Backend ", self.backend_combo),
            (" Device ", self.device_combo),
            (" Dtype ", self.dtype_combo),
        ):
            self.addWidget(QLabel(label))
            self.addWidget(combo)
        self.settings_button = QToolButton(
            text="Settings…", toolTip="Threads, fast path, compile, quantize, context length (Engine → Settings…)"
        )
        self.settings_button.clicked.connect(self.settingsRequested.emit)
        self.addWidget(self.settings_button)
        self._fill_models(None)
        self.model_combo.activated.connect(self._on_model_activated)
        self.backend_combo.currentIndexChanged.connect(self._on_backend_changed)
        self.device_combo.currentIndexChanged.connect(self._changed)
        self.dtype_combo.currentIndexChanged.connect(self._changed)

    # -- engine info ----------------------------------------------------------------------------
    def set_engine_info(self, info: dict) -> None:
        """Fill backend/device/dtype pickers from the worker's InfoRequest answer."""
        self._updating = True
        self._backends = info.get("backends", [])
        current = self._shown.backend if self._shown else self.backend_combo.currentText() or "torch"
        self.backend_combo.clear()
        for i, backend in enumerate(self._backends):
            self.backend_combo.addItem(backend["name"])
            usable = backend.get("status") == "ok"
            why = backend.get("reason") or backend.get("error") or backend.get("status", "")
            _set_item(self.backend_combo, i, usable, "" if usable else why)
        self._select(self.backend_combo, current)
        if info.get("dtypes"):
            dtype = self._shown.dtype if self._shown else self.dtype_combo.currentText()
            self.dtype_combo.clear()
            self.dtype_combo.addItems(info["dtypes"])
            self._select(self.dtype_combo, dtype)
        self._fill_devices(self._shown.device if self._shown else None)
        self._updating = False

    def _fill_devices(self, current: str | None = None) -> None:
        current = current or self.device_combo.currentText() or "cpu"
        backend = next((b for b in self._backends if b["name"] == self.backend_combo.currentText()), None)
        self.device_combo.clear()
        for i, dev in enumerate((backend or {}).get("devices", [])):
            self.device_combo.addItem(dev["name"])
            _set_item(self.device_combo, i, dev.get("available", False), dev.get("reason", ""))
        self._select(self.device_combo, current)

    # -- the request ----------------------------------------------------------------------------
    def request(self) -> LoadRequest:
        model = self.model_combo.currentData()
        return LoadRequest(
            model=None if model == NO_MODEL else model,
            device=self.device_combo.currentText() or "cpu",
            dtype=self.dtype_combo.currentText() or "float32",
            backend=self.backend_combo.currentText() or "torch",
        )

    def set_model(self, path: str | None) -> None:
        """Select ``path`` (None = embedded default) and ask for it to be loaded."""
        self._fill_models(path)
        self._changed()

    def show_model(self, spec: LoadRequest | None, *, loaded: bool) -> None:
        """Show ``spec`` without asking for a load: what is being loaded (``loaded=False``) or what
        the engine holds (``loaded=True``; None = nothing). A loaded file joins the recent models."""
        if spec is not None and spec.model and loaded:
            settings.add_recent_model(spec.model)
        self._fill_models(NO_MODEL if spec is None else spec.model)
        self._shown = spec
        if spec is not None:
            self._updating = True
            self._select(self.backend_combo, spec.backend)
            self._fill_devices(spec.device)
            self._select(self.dtype_combo, spec.dtype)
            self._updating = False

    def _fill_models(self, selected: str | None) -> None:
        self._updating = True
        self.model_combo.clear()
        if selected == NO_MODEL:
            self.model_combo.addItem(NO_MODEL_LABEL, NO_MODEL)
            self.model_combo.model().item(0).setEnabled(False)  # shown, never chosen
        self.model_combo.addItem(DEFAULT_LABEL, None)
        paths = settings.recent_models()
        if selected not in (None, NO_MODEL) and selected not in paths:
            paths = [selected, *paths]  # being loaded: listed, not yet remembered
        for path in paths:
            self.model_combo.addItem(os.path.basename(path.rstrip("/\\")) or path, path)
            self.model_combo.setItemData(self.model_combo.count() - 1, path, 3)  # 3 = ToolTipRole
        self.model_combo.addItem("Open model file…", OPEN_FILE)
        default_index = 1 if selected == NO_MODEL else 0
        index = self.model_combo.findData(selected) if selected else default_index
        self.model_combo.setCurrentIndex(max(index, 0))
        self._last_model_index = self.model_combo.currentIndex()
        self._updating = False

    def _on_model_activated(self, index: int) -> None:
        if self.model_combo.itemData(index) != OPEN_FILE:
            self._last_model_index = index
            self._changed()
            return
        self.model_combo.setCurrentIndex(self._last_model_index)
        self.open_model_dialog()

    def open_model_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open a model", "", "GGUF models (*.gguf);;All files (*)")
        if path:
            self.set_model(path)

    def _on_backend_changed(self) -> None:
        if not self._updating:
            self._updating = True
            self._fill_devices()
            self._updating = False
            self._changed()

    def _changed(self) -> None:
        if not self._updating:
            self.loadRequested.emit(self.request())

    @staticmethod
    def _select(combo: QComboBox, text: str) -> None:
        index = combo.findText(text)
        if index < 0 or not combo.model().item(index).isEnabled():
            index = next((i for i in range(combo.count()) if combo.model().item(i).isEnabled()), 0)
        combo.setCurrentIndex(index)


def _set_item(combo: QComboBox, index: int, enabled: bool, reason: str) -> None:
    item = combo.model().item(index)
    item.setEnabled(enabled)
    if reason:
        item.setToolTip(reason)
        if not enabled:
            item.setText(f"{item.text()} — {reason}")
