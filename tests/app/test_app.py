"""The main window with the real engine worker on the real default model (offscreen Qt).

One window (one worker, one model load) serves the whole module; each test leaves the chat empty.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest
from opscope.app.worker.protocol import DebugRequest, LoadRequest

pytestmark = [pytest.mark.gui, pytest.mark.slow]

GREEDY = {"temperature": 0.0, "seed": 0}


@pytest.fixture(scope="module")
def window(qapp, tmp_path_factory):
    from app_testing import open_window

    win = open_window(qapp, tmp_path_factory.mktemp("gui"))
    yield win
    from app_testing import close_window

    close_window(win)


@pytest.fixture
def chat(window):
    window.chat_session.clear()
    window.chat.sampling.temperature.setValue(0.0)
    window.chat.sampling.seed.setValue(0)
    yield window.chat
    window.chat_session.stop()


def _send(qtbot, chat, text, max_tokens):
    chat.sampling.max_tokens.setValue(max_tokens)
    chat.input.setPlainText(text)
    with qtbot.waitSignal(chat.session.replyFinished, timeout=120_000) as blocker:
        chat.send_button.click()
    return blocker.args[0]


def test_model_loads_and_status_bar_shows_it(window):
    info = window.client.model_info
    assert info["path"].endswith(".gguf") and info["device"] == "cpu" and info["dtype"] == "float32"
    bar = window.statusBar()
    assert "SmolLM2" in bar.model_label.text() and "cpu" in bar.device_label.text()
    assert info["fastpath"].startswith("on") and "fast path" in bar.device_label.text()


def test_toolbar_lists_devices_with_reasons(qtbot, window):
    toolbar = window.toolbar
    qtbot.waitUntil(lambda: toolbar.device_combo.count() > 0, timeout=60_000)
    model = toolbar.device_combo.model()
    rows = [(model.item(i).text(), model.item(i).isEnabled()) for i in range(model.rowCount())]
    assert ("cpu", True) in rows
    for text, enabled in rows:
        if not enabled:  # e.g. "cuda — torch 2.13.0+cpu sees no CUDA/ROCm GPU"
            assert " — " in text
    assert toolbar.request() == LoadRequest(model=None, device="cpu", dtype="float32", backend="torch")


def test_chat_streams_a_reply_with_stats(qtbot, chat):
    pieces, progress, live, labels = [], [], [], []
    chat.session.textAppended.connect(pieces.append)
    chat.session.promptProgress.connect(lambda done, total: progress.append((done, total)))
    chat.session.liveStats.connect(lambda stats: (live.append(stats), labels.append(chat.stats_label.text())))
    turn = _send(qtbot, chat, "What is the capital of France?", 12)
    assert turn.role == "assistant" and turn.content.strip()
    assert "".join(pieces).strip() == turn.content.strip()  # streamed pieces add up to the reply
    assert progress and progress[-1][0] == progress[-1][1] > 5  # prompt progress before the first token
    stats = turn.stats
    assert stats["generated_tokens"] >= 1 and stats["ttft_ms"] > 0 and stats["prefill_tok_s"] > 0
    label = chat.stats_label.text()
    assert label.startswith("TTFT ") and "decode" in label and f"stop: {turn.stop_reason}" in label
    assert turn.content.strip()[:20] in chat.transcript.toPlainText()
    # Live figures while streaming: TTFT from the first token on, then tokens as they arrive; the
    # last live figures are the engine's final ones (same events, same definitions).
    assert live[0]["generated_tokens"] == 1 and labels[0].startswith(f"TTFT {live[0]['ttft_ms']:.0f} ms")
    assert labels[0].endswith("generating…")
    assert [s["generated_tokens"] for s in live] == list(range(1, len(live) + 1))
    # Energy is read once the reply has ended (engine.energy): live figures cover time and tokens.
    timing = [k for k in stats if k not in ("itl_ms", "total_ms") and "energy" not in k and "_j_" not in k]
    assert {k: live[-1][k] for k in timing} == {k: stats[k] for k in timing}


def test_multi_turn_history_goes_to_the_engine(qtbot, chat):
    _send(qtbot, chat, "My name is Ada.", 6)
    chat.system_prompt.setPlainText("You are terse.")
    messages = chat.session.messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant"]
    turn = _send(qtbot, chat, "What is my name?", 6)
    assert len(chat.session.history) == 4 and turn.stats["prompt_tokens"] > 20
    chat.system_prompt.setPlainText("")


def _fed(stats: dict, stop_reason: str) -> int:
    """Tokens a turn left in the engine's KV cache: its prompt and reply, less the last sampled
    token unless the reply ended on EOS (that one is never fed back)."""
    return stats["prompt_tokens"] + stats["generated_tokens"] - (stop_reason != "eos")


def test_three_sampled_turns_reuse_the_whole_conversation_across_a_failed_load(qtbot, window, chat, tmp_path):
    """Issue 28: turn two reused 92 of the 168 tokens turn one left (a sampled reply is not its
    text's canonical tokenization), and after a failed load of another file the next turn re-read
    everything. Each turn now prefills only what is new, and the stats line says so."""
    chat.sampling.temperature.setValue(1.3)
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf file at all")
    turns = []
    for i, text in enumerate(
        ("Write a python function with numbers 12345 and a list.", "And more?", "Once more, with 678.")
    ):
        chat.sampling.seed.setValue(i)
        turns.append(_send(qtbot, chat, text, 48))
        if i == 1:  # a file the engine refuses: the old model comes back, with its cache
            with qtbot.waitSignal(window.client.jobFailed, timeout=120_000):
                window.toolbar.set_model(str(bad))
            qtbot.waitUntil(lambda: not window.client.busy, timeout=120_000)
            window.error_dialog.done(0)
    for before, after in zip(turns, turns[1:]):
        assert after.stats["cached_tokens"] == _fed(before.stats, before.stop_reason) > 0
    last = turns[-1].stats
    assert chat.stats_label.text().startswith(
        f"TTFT {last['ttft_ms']:.0f} ms · prefill {last['prompt_tokens']} tok "
        f"({last['cached_tokens']} cached) · decode "
    )
    chat.edit_button.click()  # the reply the line described is gone: the line describes the one before
    assert chat.stats_label.text().startswith(f"TTFT {turns[1].stats['ttft_ms']:.0f} ms · prefill ")
    chat.session.clear()
    assert chat.stats_label.text() == ""


def test_regenerate_and_edit_the_last_message(qtbot, chat):
    _send(qtbot, chat, "Name a colour.", 4)
    with qtbot.waitSignal(chat.session.replyFinished, timeout=120_000) as blocker:
        chat.regenerate_button.click()
    assert [t.role for t in chat.session.history] == ["user", "assistant"] and blocker.args[0].stats
    chat.edit_button.click()
    assert chat.session.history == [] and chat.input.toPlainText() == "Name a colour."
    assert not chat.regenerate_button.isEnabled()


def test_stop_ends_a_long_reply(qtbot, chat):
    chat.sampling.max_tokens.setValue(400)
    chat.input.setPlainText("Write a very long story about a lighthouse keeper.")
    with qtbot.waitSignal(chat.session.firstToken, timeout=120_000):
        chat.send_button.click()
    assert chat.stop_button.isEnabled() and not chat.send_button.isEnabled()
    with qtbot.waitSignal(chat.session.replyFinished, timeout=60_000) as blocker:
        chat.stop_button.click()
    turn = blocker.args[0]
    assert turn.stop_reason == "cancelled" and turn.stats["generated_tokens"] < 400
    assert chat.send_button.isEnabled() and not chat.stop_button.isEnabled()


@pytest.mark.perf  # a timing claim: true on a quiet machine (`make perf-check`), not beside a parallel worker
def test_event_loop_never_stalls_during_generation(qtbot, chat):
    """A 10 ms timer keeps firing while the engine generates: the longest stall stays < 100 ms.

    Time the OS kept the GUI thread waiting for a CPU (other processes on a shared machine) is
    not the app's doing and is taken out (StallMeter reads it from /proc on Linux)."""
    from opscope.app.ui.stallmeter import StallMeter

    meter = StallMeter(10).start()
    try:
        turn = _send(qtbot, chat, "Count from one to twenty.", 24)
    finally:
        meter.stop()
    assert turn.stats["generated_tokens"] >= 2 and len(meter.gaps_ms) > 20
    assert meter.max_blocked_ms < 100, meter.summary()


def test_killed_worker_shows_an_error_and_the_next_request_recovers(qtbot, window, chat):
    old_pid = window.client.pid
    with qtbot.waitSignal(window.client.crashed, timeout=30_000):
        os.kill(old_pid, signal.SIGKILL)
    card = window.notifications.latest
    assert window.notifications.isVisible() and card.isVisible()  # what the user sees, in the window
    assert "crashed" in card.text.text() and "restarts on the next request" in card.text.text()
    assert "crashed" in window.statusBar().state_label.text()
    turn = _send(qtbot, chat, "Say hello.", 4)  # restarts the worker, reloads the model, answers
    assert turn.stats["generated_tokens"] >= 1 and window.client.pid != old_pid
    window.notifications.dismiss_all()


def test_hung_worker_is_killed_after_its_timeout_and_recovers(qtbot, window, chat):
    job = window.client.submit(DebugRequest("hang"), idle_timeout_s=1.0)
    with qtbot.waitSignal(job.failed, timeout=30_000) as blocker:
        pass
    error_type, message = blocker.args
    assert error_type == "EngineCrashed" and "no sign of life for 1 s" in message
    card = window.notifications.latest
    assert card.isVisible() and "no sign of life" in card.text.text()
    turn = _send(qtbot, chat, "Say hi.", 3)
    assert turn.stats["generated_tokens"] >= 1
    window.notifications.dismiss_all()


def test_a_failed_load_keeps_the_old_model(qtbot, window, chat, tmp_path):
    """File → Open model on a file the engine refuses: a dialog and a notification say which file
    and why; the default model stays loaded, the toolbar and status bar name it, and chat works."""
    from opscope.app.ui import settings
    from opscope.app.window.toolbar import DEFAULT_LABEL

    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"not a gguf file at all")
    loaded_before = window.client.model_info["path"]
    with qtbot.waitSignal(window.client.jobFailed, timeout=120_000) as blocker:
        window.toolbar.set_model(str(bad))  # what the Open dialog does with the chosen file
        assert window.statusBar().currentMessage() == f"Loading {bad.name}…"
    assert blocker.args[0].error[0] == "BadMagic"
    qtbot.waitUntil(lambda: not window.client.busy, timeout=120_000)
    dialog = window.error_dialog
    assert dialog.isVisible() and dialog.text() == "Could not load broken.gguf"
    # one sentence, shown once: no error class, no card over the panels, no status line repeating it
    reason = blocker.args[0].error[1].rstrip(". ").removeprefix(f"{bad}: ")
    assert reason.startswith("not a GGUF file")
    assert dialog.informativeText() == (
        f"Could not load {bad} on cpu/float32: {reason} ({Path(loaded_before).name} is still loaded)."
    )
    assert "BadMagic" not in dialog.informativeText() and dialog.informativeText().count("Could not load") == 1
    assert not any(str(bad) in c.text.text() for c in window.notifications.cards)
    assert "Could not load" not in window.statusBar().currentMessage()
    dialog.done(0)
    assert window.client.model_info["path"] == loaded_before
    assert "SmolLM2" in window.statusBar().model_label.text()
    assert not window.statusBar().currentMessage().startswith("Loading")
    assert window.toolbar.model_combo.currentText() == DEFAULT_LABEL
    assert str(bad) not in settings.recent_models()
    turn = _send(qtbot, chat, "Say hello.", 4)
    assert turn.stats["generated_tokens"] >= 1 and not turn.error
    window.notifications.dismiss_all()


def test_run_opens_the_window_and_returns_when_it_closes(tmp_path):
    """What `opscope gui` calls: app.main.run(args) opens the window, returns its exit code when
    the window closes, and leaves no worker behind (run in a fresh process, as the CLI does)."""
    import subprocess
    import sys

    code = (
        "import sys; from PySide6.QtCore import QTimer; from PySide6.QtWidgets import QApplication\n"
        "from opscope.app.ui import settings; settings.use_directory(sys.argv[1])\n"
        "from opscope.app.main import run; from opscope.app.window.main_window import MainWindow\n"
        "def close():\n"
        "    wins = [w for w in QApplication.topLevelWidgets() if isinstance(w, MainWindow) and w.isVisible()]\n"
        "    if wins and wins[0].client.pid: print('worker', wins[0].client.pid, flush=True); wins[0].close()\n"
        "    else: QTimer.singleShot(50, close)\n"
        "app = QApplication(['opscope']); QTimer.singleShot(50, close)\n"
        "sys.exit(run(['--db', sys.argv[2], '--theme', 'dark']))\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "settings"), f"sqlite:///{tmp_path / 'r.db'}"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "QT_QPA_PLATFORM": "offscreen"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    pid = int(out.stdout.split()[1])
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the worker exited with the window


def test_layout_and_geometry_are_saved(window):
    from opscope.app.ui import settings

    window.save_layout()
    assert settings.value("window/state") and settings.value("window/geometry")
    dock = window.docks["telemetry"]
    dock.setFloating(True)
    window.reset_layout()
    assert not dock.isFloating()


# -- hostile model files (issue 19) --------------------------------------------------------------
def _bad_token_types(tmp: Path, tiny: Path) -> Path:
    from gguf_craft import ARRAY, I32, Craft

    craft = Craft.read(tiny)
    types = list(craft.kv("tokenizer.ggml.token_type").value)
    return craft.set("tokenizer.ggml.token_type", [99] + types[1:], ARRAY, I32).write(tmp / "types.gguf")


def _runaway_regex_dir(tmp: Path, tiny: Path) -> Path:
    """A Hugging Face directory whose tokenizer.json splits with a catastrophic-backtracking regex."""
    import json

    import numpy as np
    from opscope.engine.formats import open_model
    from opscope.engine.formats.hf_source import hf_name
    from opscope.engine.testing.gguf_writer import hf_config
    from safetensors.numpy import save_file

    src = open_model(tiny)
    d = tmp / "regex-model"
    d.mkdir()
    save_file({hf_name(n): np.ascontiguousarray(w) for n, w in src.iter_tensors()}, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps(hf_config("llama")))
    tj = json.loads(src.tokenizer.backend.to_str())
    tj["pre_tokenizer"] = {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": r"(\w+\s?)+$"}, "behavior": "Isolated", "invert": False},
            tj["pre_tokenizer"],
        ],
    }
    (d / "tokenizer.json").write_text(json.dumps(tj))
    return d


def test_hostile_files_from_the_model_picker_show_the_one_line_error(qtbot, window, chat, tmp_path):
    """Issue 19: a hostile file chosen in the model picker (what File → Open model does with the
    path) shows the engine's exact one-line error in a visible dialog and notification; the model
    loaded before stays loaded and chat still answers."""
    from opscope.engine.core.errors import ModelLoadError
    from opscope.engine.formats import open_model
    from opscope.engine.testing.gguf_writer import hf_config, write_gguf

    tiny = write_gguf(tmp_path / "tiny.gguf", hf_config("llama"), types="Q8_0")
    loaded_before = window.client.model_info["path"]
    os.symlink("/dev/zero", tmp_path / "zero.gguf")
    for bad in (_bad_token_types(tmp_path, tiny), _runaway_regex_dir(tmp_path, tiny), tmp_path / "zero.gguf"):
        with pytest.raises(ModelLoadError) as info:
            open_model(bad)
        expected = str(info.value).rstrip(". ").removeprefix(f"{bad}: ")
        with qtbot.waitSignal(window.client.jobFailed, timeout=120_000):
            window.toolbar.set_model(str(bad))
        qtbot.waitUntil(lambda: not window.client.busy, timeout=120_000)
        dialog = window.error_dialog
        assert dialog.isVisible() and dialog.text() == f"Could not load {bad.name}"
        assert f"cpu/float32: {expected} ({Path(loaded_before).name} is still loaded)." in dialog.informativeText()
        assert type(info.value).__name__ not in dialog.informativeText()
        assert not any(expected in c.text.text() for c in window.notifications.cards)
        dialog.done(0)
        assert window.client.model_info["path"] == loaded_before
    turn = _send(qtbot, chat, "Say hi.", 2)
    assert turn.stats["generated_tokens"] >= 1 and not turn.error
    window.notifications.dismiss_all()
