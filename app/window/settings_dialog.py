"""Engine → Settings…: every model option `opscope generate` takes, in the window.

Threads, attention, the CPU fast path and each of its settings, torch.compile, weight-only
quantization and the chat's context length. Apply/OK hands the settings to the window, which reloads
the model when a model option changed (a failed reload keeps the previous model: app.notify says why).
The choices come from the engine worker (``load_options``), so the GUI never imports torch.
"""

from __future__ import annotations

import os

from opscope.app.worker.settings import (
    FALLBACK_LOAD_OPTIONS,
    FASTPATH_MODES,
    EngineSettings,
    fastpath_spec_from,
    fastpath_values_from,
)
from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QGroupBox,
    QLabel,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

FASTPATH_HELP = {
    "auto": "auto — on for a float32/bfloat16 GGUF on the CPU",
    "on": "on — with the settings below",
    "off": "off — the plain torch model",
}
FIELD_TEXT = {  # label, tooltip: what each fast-path setting does (engine/fastpath/options.py)
    "weights": ("Weights", "q: keep the GGUF's quantized blocks (fused kernels) · dense: the weights as loaded"),
    "activations": (
        "Decode activations",
        "f32: exact · q8: int8 activations as llama.cpp does (faster, slightly different logits)",
    ),
    "prefill_dtype": (
        "Prefill GEMM dtype",
        "auto: with q8 activations int8 where the kernels have it (`opscope fastpath` lists the types), else bf16 where the CPU "
        "has native bf16 and the run already trades precision (q8 activations, a bfloat16 model), else f32 · "
        "f32: exact · bf16: faster where the CPU has native bf16 · int8: llama.cpp's scheme (q8 activations only)",
    ),
    "gemm_min_rows": ("GEMM from rows", "prompt tokens from which a matmul dequantizes and uses a GEMM"),
    "fused_decode": ("Fused decode step", "one C++ call per token for all layers"),
    "compile_decode": ("torch.compile decode", "compile the single-token decode step"),
    "pin_threads": ("Pin threads", "bind the OpenMP threads to distinct cores"),
    "adapt_threads": ("Adapt threads to load", "decode gives cores back while other processes use them"),
    "keep_heap": ("Keep freed memory", "reuse freed memory instead of faulting in fresh pages each prompt (glibc)"),
    "on_error": ("If kernels cannot build", "fallback: plain torch · raise: fail the load"),
}
RELOAD_NOTE = (
    "Changing a model option reloads the model; if the reload fails, the model loaded now stays "
    "loaded and the notification says why."
)


class EngineSettingsDialog(QDialog):
    applied = Signal(object)  # EngineSettings

    def __init__(
        self,
        current: EngineSettings,
        load_options: dict | None = None,
        *,
        model_context: int = 0,
        fastpath_active: bool = False,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent, windowTitle="Engine settings", objectName="engineSettings")
        options = load_options or FALLBACK_LOAD_OPTIONS
        self.field_specs: list[dict] = list(options["fastpath_fields"])
        self.threads = QSpinBox(minimum=0, maximum=max(256, 2 * (os.cpu_count() or 1)), specialValueText="auto")
        self.threads.setSuffix(" threads")
        self.threads.setToolTip(f"CPU threads for the engine; auto = torch's choice ({os.cpu_count()} cores here)")
        self.attention = _combo(options["attention"])
        self.fastpath = QComboBox()
        for mode in FASTPATH_MODES:
            self.fastpath.addItem(FASTPATH_HELP[mode], mode)
        self.compile = _combo(options["compile"])
        self.quantize = _combo(options["quantize"])
        self.context = QSpinBox(minimum=0, maximum=1 << 20, singleStep=256, suffix=" tokens")
        self.context.setSpecialValueText(
            f"the model's own ({model_context} tokens)" if model_context else "the model's own"
        )
        self._loading = False
        self.fastpath_active = fastpath_active  # the loaded model runs on the fast path ("auto" chose it)
        self.fastpath_box = QGroupBox("Fast path settings")
        self.fastpath_widgets = {spec["name"]: _field_widget(spec) for spec in self.field_specs}
        self._build()
        self.fastpath.currentIndexChanged.connect(self._update_enabled)
        for widget in self.fastpath_widgets.values():
            _changed_signal(widget).connect(self._field_edited)
        self.set_settings(current)

    def _build(self) -> None:
        model = QGroupBox("Model (reloads)")
        form = QFormLayout(model)
        for label, widget in (
            ("Threads", self.threads),
            ("Attention", self.attention),
            ("Fast path", self.fastpath),
            ("Compile", self.compile),
            ("Quantize", self.quantize),
        ):
            form.addRow(label, widget)
        fp_form = QFormLayout(self.fastpath_box)
        for name, widget in self.fastpath_widgets.items():
            label, tip = FIELD_TEXT.get(name, (name.replace("_", " ").capitalize(), ""))
            widget.setToolTip(tip)
            fp_form.addRow(label, widget)
        chat = QGroupBox("Chat")
        QFormLayout(chat).addRow("Context length", self.context)
        buttons = QDialogButtonBox(
            QDialogButtonBox.Ok | QDialogButtonBox.Apply | QDialogButtonBox.Cancel | QDialogButtonBox.RestoreDefaults
        )
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        buttons.button(QDialogButtonBox.Apply).clicked.connect(self.apply)
        buttons.button(QDialogButtonBox.RestoreDefaults).clicked.connect(lambda: self.set_settings(EngineSettings()))
        self.buttons = buttons
        layout = QVBoxLayout(self)
        for widget in (model, self.fastpath_box, chat, QLabel(RELOAD_NOTE, wordWrap=True, objectName="panelHint")):
            layout.addWidget(widget)
        layout.addWidget(buttons)

    def set_settings(self, s: EngineSettings) -> None:
        self._loading = True  # values shown, not edited: "auto" stays "auto"
        try:
            self._show_settings(s)
        finally:
            self._loading = False

    def _show_settings(self, s: EngineSettings) -> None:
        self.threads.setValue(s.threads)
        _select(self.attention, s.attention)
        self.fastpath.setCurrentIndex(max(self.fastpath.findData(s.fastpath), 0))
        _select(self.compile, s.compile)
        _select(self.quantize, s.quantize)
        self.context.setValue(s.context_length)
        for name, value in fastpath_values_from(s.fastpath_settings, self.field_specs).items():
            if name in self.fastpath_widgets:
                _set_value(self.fastpath_widgets[name], value)
        self._update_enabled()

    def settings(self) -> EngineSettings:
        values = {name: _value(w) for name, w in self.fastpath_widgets.items()}
        return EngineSettings(
            threads=self.threads.value(),
            attention=self.attention.currentText(),
            fastpath=self.fastpath.currentData(),
            fastpath_settings=fastpath_spec_from(values, self.field_specs),
            compile=self.compile.currentText(),
            quantize=self.quantize.currentText(),
            context_length=self.context.value(),
        )

    def _update_enabled(self) -> None:
        """The engine's rules: fast-path settings need the fast path on; compile and quantize belong to
        the plain torch model, so they are offered only when the fast path is not forced on."""
        on = self.fastpath.currentData() == "on"
        # "auto" that chose the fast path (the status bar says "fast path on"): its settings are live
        # ones, not greyed out; editing one makes the choice explicit (_field_edited)
        self.fastpath_box.setEnabled(on or (self.fastpath.currentData() == "auto" and self.fastpath_active))
        self.fastpath_box.setToolTip("" if on else "editing a setting turns the fast path on (they apply only then)")
        for combo in (self.compile, self.quantize):
            combo.setEnabled(not on)
            combo.setToolTip("needs the fast path off or auto (it belongs to the plain torch model)" if on else "")

    def _field_edited(self, *_args) -> None:
        """The engine applies fast-path settings only with the fast path "on": "auto" becomes "on"."""
        if not self._loading and self.fastpath.currentData() == "auto" and self.fastpath_box.isEnabled():
            self.fastpath.setCurrentIndex(self.fastpath.findData("on"))

    def apply(self) -> None:
        self.applied.emit(self.settings())

    def accept(self) -> None:
        self.apply()
        super().accept()


def _combo(items) -> QComboBox:
    combo = QComboBox()
    combo.addItems([str(i) for i in items])
    return combo


def _select(combo: QComboBox, text: str) -> None:
    combo.setCurrentIndex(max(combo.findText(str(text)), 0))


def _field_widget(spec: dict) -> QWidget:
    if spec["type"] == "bool":
        return QCheckBox()
    if spec["type"] == "int":  # "gemm_min_rows": rows are tokens (prompt positions in one pass)
        return QSpinBox(minimum=1, maximum=1 << 16, suffix=" tokens" if spec["name"].endswith("_rows") else "")
    return _combo(spec["choices"])


def _changed_signal(widget: QWidget):
    if isinstance(widget, QCheckBox):
        return widget.toggled
    if isinstance(widget, QSpinBox):
        return widget.valueChanged
    return widget.currentIndexChanged


def _set_value(widget: QWidget, value) -> None:
    if isinstance(widget, QCheckBox):
        widget.setChecked(bool(value))
    elif isinstance(widget, QSpinBox):
        widget.setValue(int(value))
    else:
        _select(widget, value)


def _value(widget: QWidget):
    if isinstance(widget, QCheckBox):
        return widget.isChecked()
    if isinstance(widget, QSpinBox):
        return widget.value()
    return widget.currentText()
