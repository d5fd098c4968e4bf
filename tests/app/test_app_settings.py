"""Every engine setting in the window (Engine → Settings…, sampling presets) with the real worker,
and the context length the worker fits a chat into, on the real default model."""

from __future__ import annotations

import json
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest
from opscope.app.worker.settings import FALLBACK_LOAD_OPTIONS, EngineSettings

pytestmark = [pytest.mark.gui]


@pytest.fixture(scope="module")
def window(qapp, tmp_path_factory):
    from app_testing import close_window, open_window

    win = open_window(qapp, tmp_path_factory.mktemp("gui-settings"))
    yield win
    close_window(win)


def _ok(dialog):
    from PySide6.QtWidgets import QDialogButtonBox

    dialog.buttons.button(QDialogButtonBox.Ok).click()


def _reload(qtbot, window, action):
    with qtbot.waitSignal(window.client.modelChanged, timeout=240_000):
        action()
    return window.client.model_info


def test_the_gui_offers_what_the_engine_accepts():
    from opscope.app.worker.jobs import load_options

    assert load_options() == FALLBACK_LOAD_OPTIONS


def test_settings_dialog_shows_every_model_option(qtbot, window):
    dialog = window.open_engine_settings()
    qtbot.waitExposed(dialog)
    assert dialog.isVisible() and dialog.windowTitle() == "Engine settings"
    assert dialog.threads.value() == 1  # the window was opened with one thread
    assert [dialog.attention.itemText(i) for i in range(dialog.attention.count())] == ["sdpa", "naive"]
    assert [dialog.compile.itemText(i) for i in range(dialog.compile.count())] == ["off", "decode"]
    assert [dialog.quantize.itemText(i) for i in range(dialog.quantize.count())] == ["off", "int8", "int4"]
    assert set(dialog.fastpath_widgets) == {
        "weights",
        "activations",
        "prefill_dtype",
        "gemm_min_rows",
        "fused_decode",
        "compile_decode",
        "pin_threads",
        "adapt_threads",
        "keep_heap",
        "on_error",
    }
    assert "the model's own (" in dialog.context.specialValueText()
    # Issue 28: "auto" chose the fast path (the status bar says so): its settings are not greyed out
    assert (
        window.client.model_info["fastpath"].startswith("on") and "fast path" in window.statusBar().device_label.text()
    )
    assert dialog.fastpath.currentData() == "auto" and dialog.fastpath_box.isEnabled()
    assert dialog.fastpath_box.title() == "Fast path settings"
    dialog.fastpath.setCurrentIndex(dialog.fastpath.findData("off"))
    assert not dialog.fastpath_box.isEnabled()
    dialog.fastpath.setCurrentIndex(dialog.fastpath.findData("auto"))
    dialog.fastpath_widgets["pin_threads"].toggle()  # a setting edited under "auto": it applies only when on
    assert dialog.fastpath.currentData() == "on" and dialog.fastpath_box.isEnabled() and not dialog.quantize.isEnabled()
    dialog.reject()


def test_fast_path_settings_apply_by_reloading_and_persist(qtbot, window):
    from opscope.app.ui import settings
    from opscope.engine.fastpath.kernels import int8_prefill, native_bf16

    dialog = window.open_engine_settings()
    dialog.fastpath.setCurrentIndex(dialog.fastpath.findData("on"))
    prefill = dialog.fastpath_widgets["prefill_dtype"]
    assert [prefill.itemText(i) for i in range(prefill.count())] == ["auto", "bf16", "f32", "int8"]
    assert prefill.currentText() == "auto"
    dialog.fastpath_widgets["activations"].setCurrentText("q8")
    info = _reload(qtbot, window, lambda: _ok(dialog))
    assert "activations=q8" in info["fastpath"]
    assert window.client.model_spec.fastpath == "activations=q8"
    # "auto": int8 activations take int8 prefill GEMMs where the kernels have them, else bf16 ones where
    # this CPU multiplies bf16 natively; the status bar says which (its label may be elided: its
    # tooltip holds the whole line)
    shown = window.statusBar().device_label.toolTip()
    int8 = int8_prefill()
    assert ("prefill_dtype=int8" in info["fastpath"]) == ("prefill_dtype=int8" in shown) == int8
    assert ("prefill_dtype=bf16" in info["fastpath"]) == ("prefill_dtype=bf16" in shown) == (native_bf16() and not int8)
    saved = json.loads(settings.value("engine/settings"))
    assert saved["fastpath"] == "on" and saved["fastpath_settings"] == "activations=q8"
    again = window.open_engine_settings()
    assert again.fastpath.currentData() == "on"
    assert again.fastpath_widgets["activations"].currentText() == "q8"
    again.reject()


def test_an_f32_prefill_chosen_with_int8_activations_is_kept(qtbot, window):
    dialog = window.open_engine_settings()
    dialog.fastpath.setCurrentIndex(dialog.fastpath.findData("on"))
    dialog.fastpath_widgets["activations"].setCurrentText("q8")
    dialog.fastpath_widgets["prefill_dtype"].setCurrentText("f32")
    info = _reload(qtbot, window, lambda: _ok(dialog))
    assert window.client.model_spec.fastpath == "activations=q8,prefill_dtype=f32"
    assert "activations=q8" in info["fastpath"] and "prefill_dtype" not in info["fastpath"]  # f32: the default


def test_threads_and_attention_reach_the_worker(qtbot, window):
    dialog = window.open_engine_settings()
    dialog.fastpath.setCurrentIndex(dialog.fastpath.findData("off"))
    dialog.attention.setCurrentText("naive")
    info = _reload(qtbot, window, lambda: _ok(dialog))
    assert info["fastpath"] == "off"
    assert window.client.model_spec.attention == "naive" and window.client.model_spec.threads == 1
    assert "SmolLM2" in window.toolbar.model_combo.currentText()


def test_a_rejected_setting_keeps_the_loaded_model_and_says_why(qtbot, window):
    before = window.client.model_spec
    with qtbot.waitSignal(window.client.jobFailed, timeout=240_000):
        window.apply_engine_settings(EngineSettings(threads=1, fastpath="on", quantize="int8"))
    qtbot.waitUntil(lambda: window.error_dialog is not None and window.error_dialog.isVisible(), timeout=10_000)
    text = window.error_dialog.informativeText()
    assert "compile and quantize apply to the plain torch model" in text and "is still loaded" in text
    # one sentence, in the dialog only: no error class, no card repeating it over the panels
    assert "ConfigError" not in text and window.notifications.latest is None
    qtbot.waitUntil(lambda: window.client.model_info is not None, timeout=240_000)
    assert window.client.model_spec == before
    assert window.engine_settings.quantize == "off" and window.engine_settings.fastpath == "off"  # what is loaded
    window.error_dialog.done(0)


def test_context_length_goes_with_every_chat_request(qtbot, window):
    dialog = window.open_engine_settings()
    dialog.context.setValue(512)
    _ok(dialog)
    assert window.chat_session.context_length == 512
    assert "no reload needed" in window.statusBar().currentMessage()
    with qtbot.waitSignal(window.chat_session.replyFinished, timeout=120_000) as blocker:
        job = window.chat_session.send("Say hi.", {"max_tokens": 2})
    assert job.request.context_length == 512
    assert blocker.args[0].role == "assistant" and not blocker.args[0].error


def test_sampling_presets_fill_the_form_and_edits_make_it_custom(qtbot, tmp_path):
    from opscope.app.chat.panel import SamplingForm
    from opscope.app.ui import settings

    settings.use_directory(str(tmp_path))
    form = SamplingForm()
    qtbot.addWidget(form)
    assert form.preset.currentText() == "Balanced"
    form.preset.setCurrentText("Precise")
    assert (form.temperature.value(), form.top_k.value(), form.top_p.value()) == (0.2, 20, 0.9)
    assert form.config()["repetition_penalty"] == 1.1
    form.preset.setCurrentText("Creative")
    assert form.temperature.value() == 1.1 and form.top_k.value() == 100
    form.top_k.setValue(77)
    assert form.preset.currentText() == "Custom"
    form.max_tokens.setValue(300)
    restored = SamplingForm()  # a new window remembers the choice
    qtbot.addWidget(restored)
    assert restored.preset.currentText() == "Custom"
    assert (restored.top_k.value(), restored.temperature.value(), restored.max_tokens.value()) == (77, 1.1, 300)
    restored.temperature.setValue(0.0)
    restored.top_k.setValue(0)
    restored.top_p.setValue(1.0)
    restored.min_p.setValue(0.0)
    restored.repetition_penalty.setValue(1.0)
    assert restored.preset.currentText() == "Greedy"


def test_engine_settings_round_trip_and_ignore_garbage():
    s = EngineSettings(
        threads=3, attention="naive", fastpath="on", fastpath_settings="activations=q8", context_length=1024
    )
    assert EngineSettings.from_json(s.to_json()) == s
    assert EngineSettings.from_json("not json") == EngineSettings()
    assert EngineSettings.from_json('{"threads": "many", "attention": "naive"}') == EngineSettings(attention="naive")
    assert s.load_fields() == {
        "threads": 3,
        "attention": "naive",
        "fastpath": "activations=q8",
        "compile": "off",
        "quantize": "off",
    }
    assert EngineSettings(fastpath="on").load_fields()["fastpath"] == "weights=q"


def test_fit_context_drops_the_oldest_turns_to_fit(lm):
    from opscope.app.worker.jobs import fit_context
    from opscope.engine.core.errors import ConfigError

    system = {"role": "system", "content": "You are brief."}
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message number {i} " * 20} for i in range(9)]
    messages = [system, *turns]
    assert fit_context(lm, messages, 0, 16) == messages  # the model's 8k context holds it all
    kept = fit_context(lm, messages, 200, 16)
    assert kept[0] == system and kept[-1] == turns[-1] and len(kept) < len(messages)
    assert kept[1:] == turns[len(turns) - len(kept) + 1 :]  # the newest turns, in order
    text = lm.tokenizer.apply_chat_template(kept, add_generation_prompt=True)
    assert len(lm.tokenizer.encode(text, add_special_tokens=False)) + 16 <= 200
    with pytest.raises(ConfigError, match="do not fit the context length of 20 tokens"):
        fit_context(lm, messages, 20, 16)


def test_stop_strings_and_the_other_generation_settings_reach_the_engine(qtbot, window):
    chat = window.chat
    form = chat.sampling
    form.preset.setCurrentText("Greedy")
    form.max_tokens.setValue(40)
    form.stop_strings.setText(" |\\n")  # a space or a line break: the reply stops after its first word
    form.ignore_eos.setChecked(True)
    form.reuse_prefix.setChecked(False)
    form.prefill_chunk.setValue(16)
    config = form.config()
    assert config["stop"] == [" ", "\n"] and config["ignore_eos"] and not config["reuse_prefix"]
    assert config["prefill_chunk"] == 16
    chat.input.setPlainText("Name a colour.")
    with qtbot.waitSignal(chat.session.replyFinished, timeout=120_000) as blocker:
        chat.send_button.click()
    turn = blocker.args[0]
    assert turn.stop_reason == "stop_string" and " " not in turn.content.strip()
    assert "stop: stop_string" in chat.stats_label.text()
