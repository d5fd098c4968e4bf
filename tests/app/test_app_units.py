"""GUI parts that need no model: the worker client's failure handling, the op table at 100k+ rows,
the Runs panel on a real SQLite store, the benchmark parameter form, themes and resources."""

from __future__ import annotations

import configparser
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import numpy as np
import pytest
from opscope import resources
from opscope.app.ui.engine_client import EngineClient
from opscope.app.worker.protocol import DebugRequest, PingRequest

pytestmark = pytest.mark.gui


# -- engine client: crashes, hangs and recovery without a model ------------------------------------
@pytest.fixture
def client(qapp):
    c = EngineClient(ping_interval_ms=200)
    yield c
    c.shutdown()


def _finish(qtbot, job, timeout=60_000):
    with qtbot.waitSignal(job.finished, timeout=timeout) as blocker:
        pass
    return blocker.args[0]


def test_worker_crash_fails_the_job_with_a_clear_message_then_restarts(qtbot, client):
    _finish(qtbot, client.submit(DebugRequest("noop")))
    first_pid = client.pid
    job = client.submit(DebugRequest("crash"))
    with qtbot.waitSignals([job.failed, client.crashed], timeout=60_000):
        pass
    assert job.error[0] == "EngineCrashed" and "crashed while running debug" in job.error[1]
    assert client.state == "crashed"
    assert _finish(qtbot, client.submit(DebugRequest("noop"))) == {"action": "noop"}
    assert client.pid != first_pid and client.state == "idle"


def test_a_silent_job_is_killed_after_its_idle_timeout(qtbot, client):
    job = client.submit(DebugRequest("hang"), idle_timeout_s=0.5)
    with qtbot.waitSignal(job.failed, timeout=60_000):
        pass
    assert "no sign of life for 0 s during debug" in job.error[1] or "no sign of life for 1 s" in job.error[1]
    assert _finish(qtbot, client.submit(DebugRequest("noop")))["action"] == "noop"


def test_unexpected_exit_is_reported_with_the_exit_code(qtbot, client):
    job = client.submit(DebugRequest("exit"))
    with qtbot.waitSignal(job.failed, timeout=60_000):
        pass
    assert "exited with code 3" in job.error[1]


def test_requests_queue_in_order_and_ping_is_answered_while_busy(qtbot, client):
    order = []
    jobs = [client.submit(DebugRequest("noop")) for _ in range(3)]
    for i, job in enumerate(jobs):
        job.finished.connect(lambda _r, i=i: order.append(i))
    qtbot.waitUntil(lambda: len(order) == 3, timeout=60_000)
    assert order == [0, 1, 2] and not client.busy
    pong = client.submit(PingRequest())
    assert _finish(qtbot, pong)["pong"] is True


# -- trace op table --------------------------------------------------------------------------------
def _ops(n: int) -> dict[str, list]:
    rng = np.random.default_rng(0)
    device = rng.choice(["cpu", "cuda:0"], n).tolist()
    kind = np.where(np.array(device) == "cpu", "fallback", "on_target").tolist()
    return {
        "seq": list(range(n)),
        "op": rng.choice(["aten.mm.default", "aten.add.Tensor", "aten._to_copy.default"], n).tolist(),
        "kind": kind,
        "direction": [""] * n,
        "device": device,
        "module": [f"layers.{i % 30}.attn_norm" if i % 2 else f"layers.{i % 30}.mlp.up_proj" for i in range(n)],
        "source": ["engine/trace/planted.py:33" if i % 7 == 0 else "" for i in range(n)],
        "step": [i // 1000 for i in range(n)],
        "t_us": np.arange(n, dtype=float).tolist(),
        "dur_us": [1.0] * n,
        "bytes": [64] * n,
        "shapes": ["1x576"] * n,
    }


def test_op_table_model_filters_150k_rows(qapp):
    from opscope.app.trace.ops_model import OpTableModel
    from PySide6.QtCore import Qt

    model = OpTableModel()
    data = _ops(150_000)
    for lo in range(0, 150_000, 4000):
        model.add_batch({k: v[lo : lo + 4000] for k, v in data.items()})
    model.commit()
    assert model.rowCount() == model.total == 150_000
    assert model.data(model.index(149_999, 0)) == "149999"
    cpu = model.set_filter(device="cpu")
    assert cpu == data["device"].count("cpu") and model.rowCount() == cpu
    assert all(model.row_dict(r)["device"] == "cpu" for r in (0, cpu // 2, cpu - 1))
    assert model.set_filter(module="layers.*.attn_norm", op="add") == sum(
        1 for m, o in zip(data["module"], data["op"]) if m.endswith("attn_norm") and "add" in o
    )
    finding = model.set_filter(sources=("engine/trace/planted.py:33",), modules=("layers.*.attn_norm",))
    assert 0 < finding < 150_000
    assert model.data(model.index(0, 4), Qt.ForegroundRole) is not None  # device column is coloured


def test_op_table_view_renders_only_what_is_visible(qtbot):
    from opscope.app.trace.ops_model import OpTableModel
    from PySide6.QtWidgets import QTableView

    model = OpTableModel()
    model.add_batch(_ops(120_000))
    model.commit()
    calls = []
    original = model.data
    model.data = lambda index, role=0: (calls.append(index.row()), original(index, role))[1]
    view = QTableView()
    view.verticalHeader().setDefaultSectionSize(20)
    view.setModel(model)
    view.resize(800, 400)
    qtbot.addWidget(view)
    view.show()
    view.scrollToBottom()
    view.grab()
    assert calls and max(calls) == 119_999 and len(set(calls)) < 200  # ~20 rows on screen, not 120k


# -- runs panel on a real store -------------------------------------------------------------------
@pytest.fixture
def store_url(tmp_path):
    from opscope.engine.core.results import Metric, RunResult, TelemetrySeries
    from opscope.engine.store import RunStore

    url = f"sqlite:///{tmp_path / 'runs.db'}"
    rng = np.random.default_rng(1)
    with RunStore.open(url) as store:
        for name, center, tags in (("base", 100.0, ["baseline"]), ("fast", 120.0, ["tuned"]), ("same", 100.0, [])):
            metric = Metric("tg16", "tok/s", list(rng.normal(center, 1.0, 12)), params={"depth": 0})
            series = TelemetrySeries("host.cpu_pct", "%", [0, 100_000_000, 200_000_000], [10.0, 50.0, 40.0])
            store.save(
                RunResult(
                    kind="llm",
                    name=name,
                    tags=tags,
                    settings={"model": None, "device": "cpu"},
                    fingerprint={"cpu": "x", "threads": 2 if name != "fast" else 1},
                    metrics=[metric],
                    telemetry=[series],
                )
            )
    return url


@pytest.fixture
def runs_panel(qtbot, store_url):
    from opscope.app.runs.model import RunsModel
    from opscope.app.runs.panel import RunsPanel

    panel = RunsPanel(RunsModel(store_url))
    qtbot.addWidget(panel)
    panel.resize(1200, 800)
    panel.show()
    panel.refresh()
    yield panel
    panel.shutdown()


def _names(panel) -> set[str]:
    return {panel.table.item(r, 1).text() for r in range(panel.table.rowCount())}


def test_runs_list_search_filter_and_sort(runs_panel):
    assert _names(runs_panel) == {"base", "fast", "same"}
    runs_panel.search.setText("fa")
    assert _names(runs_panel) == {"fast"}
    runs_panel.search.setText("")
    tag = runs_panel.filters["tag"]
    tag.setCurrentIndex(tag.findData("baseline"))
    assert _names(runs_panel) == {"base"}
    tag.setCurrentIndex(0)
    device = runs_panel.filters["device"]
    assert device.findData("cpu") > 0
    runs_panel.table.sortItems(0)
    ids = [int(runs_panel.table.item(r, 0).text()) for r in range(3)]
    assert ids == sorted(ids)


def test_open_a_run_shows_metrics_histogram_telemetry_and_fingerprint(runs_panel):
    runs_panel.select_ids([runs_panel.rows[-1].info.id])
    runs_panel.open_selected()
    detail = runs_panel.detail
    assert detail.metrics.rowCount() == 1 and detail.metrics.item(0, 0).text() == "tg16"
    assert detail.histogram.getPlotItem().listDataItems()
    assert detail.telemetry.getPlotItem().listDataItems()
    assert detail.fingerprint.topLevelItemCount() == 2


def test_compare_two_runs_shows_delta_p_value_and_fingerprint_diff(runs_panel):
    by_name = {r.info.name: r.info.id for r in runs_panel.rows}
    runs_panel.select_ids([by_name["base"], by_name["fast"]])
    runs_panel.compare_selected()
    view = runs_panel.compare_view
    headers = [view.table.horizontalHeaderItem(c).text() for c in range(view.table.columnCount())]
    assert headers == ["metric", "unit", "base", "fast", "Δ fast"]
    delta = view.table.item(0, 4)
    assert delta.text().startswith("+") and delta.text().endswith("%")  # ~20% faster, clearly significant
    assert "p=" in delta.toolTip()  # the test's p and counts on hover, the cell stays short
    assert view.diff.rowCount() >= 1 and any(
        "threads" in view.diff.item(r, 0).text() for r in range(view.diff.rowCount())
    )
    assert len(view.distributions.getPlotItem().listDataItems()) == 2


def test_compare_of_equal_runs_shows_tilde(runs_panel):
    by_name = {r.info.name: r.info.id for r in runs_panel.rows}
    runs_panel.select_ids([by_name["base"], by_name["same"]])
    runs_panel.compare_selected()
    assert runs_panel.compare_view.table.item(0, 4).text().startswith("~")


def test_rename_tag_delete_and_export(runs_panel, tmp_path):
    model = runs_panel.model
    base = next(r.info.id for r in runs_panel.rows if r.info.name == "base")
    model.rename(base, "renamed")
    model.set_tags(base, ["a", "b"])
    assert "renamed" in _names(runs_panel)
    assert model.store.info(base).tags == ("a", "b")
    out = model.export(base, tmp_path / "run.json")
    assert '"renamed"' in out.read_text()
    runs_panel.select_ids([base])
    assert runs_panel.delete_selected(confirm=False)
    assert "renamed" not in _names(runs_panel)


def test_rename_to_a_taken_name_reports_the_error(runs_panel):
    from opscope.engine.core.errors import ConfigError

    base = next(r.info.id for r in runs_panel.rows if r.info.name == "base")
    with pytest.raises(ConfigError, match="already exists"):
        runs_panel.model.rename(base, "fast")


# -- benchmark parameter form ---------------------------------------------------------------------
def test_param_form_round_trips_every_kind(qtbot):
    from opscope.app.bench.panel import ParamForm

    fields = [
        {"name": "pp", "kind": "int", "default": 512, "quick": 64},
        {"name": "budget", "kind": "float", "default": 2.0, "quick": 0.5},
        {"name": "sizes", "kind": "tuple_int", "default": [128, 256], "quick": [64]},
        {"name": "dtypes", "kind": "tuple_str", "default": ["float32", "bfloat16"], "quick": ["float32"]},
        {"name": "checkpoint", "kind": "bool", "default": False, "quick": True},
    ]
    fields = [{**f, "label": f["name"].capitalize(), "unit": "", "help": "what it changes"} for f in fields]
    form = ParamForm()
    qtbot.addWidget(form)
    form.set_fields(fields, quick=True)
    assert form.values() == {"pp": 64, "budget": 0.5, "sizes": [64], "dtypes": ["float32"], "checkpoint": True}
    form.set_fields(fields, quick=False)
    assert form.values()["sizes"] == [128, 256] and form.values()["dtypes"] == ["float32", "bfloat16"]


def test_bench_params_reach_the_suite_dataclass():
    from opscope.app.worker.bench import build_params, suite_catalog
    from opscope.engine.bench.suites import get_suite
    from opscope.engine.core.errors import ConfigError

    catalog = {s["name"]: s for s in suite_catalog()}
    assert {"llm", "matmul", "bandwidth"} <= set(catalog)
    matmul = get_suite("matmul")
    params = build_params(matmul, {"sizes": [64], "dtypes": ["float32"]}, quick=True)
    assert (
        params.sizes == (64,) and params.dtypes == ("float32",) and params.call_budget_s == matmul.QUICK.call_budget_s
    )
    with pytest.raises(ConfigError, match="unknown parameter"):
        build_params(matmul, {"size": [64]}, quick=True)


# -- themes and resources -------------------------------------------------------------------------
def test_resources_are_found_through_importlib_resources():
    assert resources.read_bytes("opscope.svg").startswith(b"<?xml")
    for size in resources.ICON_SIZES:
        assert resources.icon_png(size)[:8] == b"\x89PNG\r\n\x1a\n"
    for theme in resources.THEMES:
        assert "QFrame#noticeBar" in resources.stylesheet(theme)
    entry = configparser.ConfigParser(interpolation=None)
    entry.read_string(resources.read_text("opscope.desktop"))
    desktop = entry["Desktop Entry"]
    assert desktop["Type"] == "Application" and desktop["Exec"].startswith("opscope") and desktop["Icon"] == "opscope"


def test_theme_follows_mode_and_styles_the_app(qapp):
    from opscope.app.ui.theme import ThemeManager
    from PySide6.QtGui import QPalette

    theme = ThemeManager(qapp, "dark")
    seen = []
    theme.changed.connect(seen.append)
    assert theme.current == "dark" and qapp.palette().color(QPalette.Window).lightness() < 80
    theme.set_mode("light")
    assert seen == ["light"] and qapp.palette().color(QPalette.Window).lightness() > 180
    assert "QFrame#card" in qapp.styleSheet()
    theme.set_mode("system")  # the offscreen platform reports no dark preference
    assert theme.current in ("light", "dark")


def test_desktop_entry_installs_and_uninstalls_under_a_prefix(tmp_path):
    from opscope.app.desktop_entry import main

    assert main(["--prefix", str(tmp_path)]) == 0
    entry = tmp_path / "applications" / "opscope.desktop"
    assert entry.read_bytes() == resources.read_bytes("opscope.desktop")
    assert (tmp_path / "icons/hicolor/256x256/apps/opscope.png").read_bytes() == resources.icon_png(256)
    assert (tmp_path / "icons/hicolor/scalable/apps/opscope.svg").exists()
    assert main(["--prefix", str(tmp_path), "--uninstall"]) == 0
    assert not entry.exists()


# -- toolbar, notices, options --------------------------------------------------------------------
@pytest.fixture
def isolated_settings(tmp_path):
    from opscope.app.ui import settings

    settings.use_directory(str(tmp_path / "settings"))
    settings.settings().clear()
    return settings


def test_toolbar_lists_devices_with_reasons_and_remembers_recent_models(qtbot, isolated_settings):
    from opscope.app.window.toolbar import DEFAULT_LABEL, ModelToolBar

    bar = ModelToolBar()
    qtbot.addWidget(bar)
    info = {
        "backends": [
            {
                "name": "torch",
                "status": "ok",
                "devices": [
                    {"name": "cpu", "available": True, "reason": ""},
                    {"name": "cuda", "available": False, "reason": "torch 2.13.0+cpu is a CPU-only build"},
                ],
            },
            {"name": "mlx", "status": "failed", "error": "mlx is not installed", "devices": []},
        ],
        "dtypes": ["float32", "bfloat16"],
    }
    bar.set_engine_info(info)
    model = bar.device_combo.model()
    assert model.item(0).isEnabled() and not model.item(1).isEnabled()
    assert model.item(1).text() == "cuda — torch 2.13.0+cpu is a CPU-only build"
    assert not bar.backend_combo.model().item(1).isEnabled()
    assert bar.model_combo.itemText(0) == DEFAULT_LABEL
    with qtbot.waitSignal(bar.loadRequested) as blocker:
        bar.set_model("/models/tiny.gguf")
    assert blocker.args[0].model == "/models/tiny.gguf" and bar.model_combo.currentText() == "tiny.gguf"
    assert isolated_settings.recent_models() == []  # remembered once it has loaded, not before
    with qtbot.waitSignal(bar.loadRequested) as blocker:
        bar.dtype_combo.setCurrentText("bfloat16")
    assert blocker.args[0].dtype == "bfloat16" and blocker.args[0].model == "/models/tiny.gguf"


def test_toolbar_shows_what_is_loaded_not_what_was_asked(qtbot, isolated_settings):
    from opscope.app.window.toolbar import DEFAULT_LABEL, NO_MODEL_LABEL, ModelToolBar
    from opscope.app.worker.protocol import LoadRequest

    bar = ModelToolBar()
    qtbot.addWidget(bar)
    asked = []
    bar.loadRequested.connect(asked.append)
    bar.show_model(LoadRequest(model="/models/bad.gguf"), loaded=False)  # being loaded
    assert bar.model_combo.currentText() == "bad.gguf"
    bar.show_model(LoadRequest(), loaded=True)  # it failed; the default is what the engine holds
    assert bar.model_combo.currentText() == DEFAULT_LABEL and bar.model_combo.findData("/models/bad.gguf") < 0
    bar.show_model(LoadRequest(model="/models/good.gguf", dtype="bfloat16"), loaded=True)
    assert bar.model_combo.currentText() == "good.gguf" and bar.dtype_combo.currentText() == "bfloat16"
    assert isolated_settings.recent_models() == ["/models/good.gguf"]
    bar.show_model(None, loaded=True)  # nothing loaded
    assert bar.model_combo.currentText() == NO_MODEL_LABEL
    assert asked == []  # showing never asks for a load


@pytest.fixture
def host(qtbot):
    """A shown main window for the notification area to live in (isVisible needs a shown top level)."""
    from opscope.app.ui.notify import NotificationArea, Notifier
    from PySide6.QtWidgets import QMainWindow

    window = QMainWindow()
    window.notifier = Notifier(window)
    window.notifications = NotificationArea(window.notifier, window)
    window.resize(900, 600)
    qtbot.addWidget(window)
    window.show()
    qtbot.waitExposed(window)
    return window


def test_notification_area_shows_the_reason_details_and_dismisses(qtbot, host):
    area = host.notifications
    assert not area.isVisible()
    host.notifier.error("The engine process crashed.", "last output: Segmentation fault")
    card = area.latest
    assert area.isVisible() and card.isVisible() and card.text.isVisible()
    assert card.text.text() == "The engine process crashed." and card.details_button.isVisible()
    assert area.geometry().right() <= host.width() and area.geometry().bottom() <= host.height()
    box = card.show_details()
    assert box.isVisible() and box.detailedText() == "last output: Segmentation fault"
    box.done(0)
    card.dismiss_button.click()
    assert not area.isVisible() and area.latest is None and host.notifier.history[-1].level == "error"


@pytest.mark.qt_no_exception_capture
def test_uncaught_exceptions_from_slots_and_threads_reach_the_notification_area(qtbot, host):
    import threading

    from opscope.app.ui.notify import install_excepthooks
    from PySide6.QtCore import QTimer

    def broken_slot():
        raise ValueError("a bug in a slot")

    def broken_thread():
        raise RuntimeError("a bug in a thread")

    uninstall = install_excepthooks(host.notifier)
    try:
        QTimer.singleShot(0, broken_slot)
        qtbot.waitUntil(lambda: host.notifications.latest is not None, timeout=5000)
        card = host.notifications.latest
        assert card.isVisible() and "ValueError: a bug in a slot" in card.text.text()
        assert "Traceback" in card.notice.details and "broken_slot" in card.notice.details
        thread = threading.Thread(target=broken_thread, name="exporter")
        thread.start()
        thread.join()
        qtbot.waitUntil(lambda: "a bug in a thread" in host.notifications.latest.text.text(), timeout=5000)
        assert "in exporter" in host.notifications.latest.text.text()
    finally:
        uninstall()


def test_a_failed_export_is_reported_with_the_path(qtbot, host, tmp_path):
    from opscope.app.ui.notify import export_guard

    target = tmp_path / "missing" / "conversation.md"
    with export_guard(host.centralWidget() or host, "save the conversation", str(target)):
        target.write_text("x")
    card = host.notifications.latest
    assert card.isVisible() and f"Could not save the conversation to {target}" in card.text.text()
    assert "No such file or directory" in card.text.text() and "FileNotFoundError" in card.notice.details


# -- the real window when the model given at start cannot load --------------------------------------
@pytest.fixture(scope="module")
def bad_start(qapp, tmp_path_factory):
    """The window as `opscope gui --model BROKEN` opens it (the engine worker is real)."""
    from app_testing import close_window, wait_until
    from opscope.app.ui import settings
    from opscope.app.ui.engine_client import EngineClient
    from opscope.app.ui.theme import ThemeManager
    from opscope.app.window.main_window import MainWindow
    from opscope.app.worker.protocol import LoadRequest

    base = tmp_path_factory.mktemp("bad-start")
    bad = base / "broken.gguf"
    bad.write_bytes(b"not a gguf file at all")
    settings.use_directory(str(base / "settings"))
    window = MainWindow(
        EngineClient(),
        ThemeManager(qapp, "light"),
        db_url=f"sqlite:///{base / 'runs.db'}",
        initial_model=LoadRequest(model=str(bad)),
    )
    window.resize(1200, 800)
    window.show()
    wait_until(qapp, lambda: not window.client.busy, 120, "the failed load")
    yield window, bad
    close_window(window)


def test_a_model_that_fails_at_start_leaves_nothing_loaded_and_says_why(bad_start):
    from opscope.app.window.toolbar import NO_MODEL_LABEL

    window, bad = bad_start
    assert window.client.model_info is None and window.client.model_spec is None
    assert window.toolbar.model_combo.currentText() == NO_MODEL_LABEL
    assert window.statusBar().model_label.text() == "model: none loaded"
    assert not window.statusBar().currentMessage().startswith("Loading")
    assert not any(str(bad) in c.text.text() for c in window.notifications.cards)  # the dialog says it, once
    dialog = window.error_dialog
    assert dialog.isVisible() and dialog.text() == "Could not load broken.gguf"
    text = dialog.informativeText()
    assert text.startswith(f"Could not load {bad} on cpu/float32: ") and "not a GGUF file" in text
    assert text.endswith("(no model is loaded: pick one in the toolbar (Model) or with File → Open model).")
    assert "BadMagic" not in text and "Traceback" in dialog.detailedText()
    dialog.done(0)


def test_a_chat_message_without_a_model_says_why(qtbot, bad_start):
    window, _bad = bad_start
    chat = window.chat
    chat.input.setPlainText("Hello?")
    with qtbot.waitSignal(chat.session.replyFailed, timeout=60_000):
        chat.send_button.click()
    card = window.notifications.latest
    assert card.isVisible() and card.text.text().startswith("The chat reply failed: no model is loaded")
    assert chat.stats_label.text().startswith("no model is loaded") and "ConfigError" not in chat.stats_label.text()
    assert "no model is loaded" in chat.transcript.toPlainText()
    window.chat_session.clear()


def test_a_worker_crash_reaches_the_notification_area(qtbot, bad_start):
    window, _bad = bad_start
    job = window.client.submit(DebugRequest("crash"))
    with qtbot.waitSignal(window.client.crashed, timeout=60_000):
        pass
    card = window.notifications.latest
    assert job.error[0] == "EngineCrashed" and card.isVisible()
    assert "The engine process crashed while running debug" in card.text.text()
    assert "restarts on the next request" in card.text.text()
    assert "crashed" in window.statusBar().state_label.text()
    assert sum("crashed while running debug" in c.text.text() for c in window.notifications.cards) == 1


def test_a_queued_chat_message_says_what_it_waits_for(qtbot, bad_start):
    window, _bad = bad_start
    chat = window.chat
    blocker = window.client.submit(DebugRequest("hang"), idle_timeout_s=3.0)
    qtbot.waitUntil(lambda: blocker.running, timeout=60_000)
    chat.input.setPlainText("Are you there?")
    chat.send_button.click()
    assert chat.progress.isVisible() and chat.progress.format() == "Waiting for a debug request…"
    with qtbot.waitSignal(chat.session.replyFailed, timeout=60_000):
        pass  # the watchdog kills the hung worker; the queued message fails with it
    window.notifications.dismiss_all()
    window.chat_session.clear()


# -- chat transcript: Markdown while streaming -------------------------------------------------------
def _blocks(doc):
    block, out = doc.begin(), []
    while block.isValid():
        out.append(block)
        block = block.next()
    return out


def _fragments(block):
    it, out = block.begin(), []
    while not it.atEnd():
        out.append(it.fragment())
        it += 1
    return out


def test_transcript_renders_markdown_with_the_role_label_on_its_own_line(qtbot):
    from opscope.app.chat.session import Turn
    from opscope.app.chat.transcript import ChatTranscript
    from PySide6.QtGui import QFont

    view = ChatTranscript()
    qtbot.addWidget(view)
    reply = "1. Apple `pip` **bold** *it*\n2. Pear\n\n```python\nx = 1\n```\nDone <b>raw</b>"
    view.show_turns(
        [Turn("user", "List **two** fruits"), Turn("assistant", reply, {"ttft_ms": 5.0}, "eos")],
        lambda t: ("TTFT 5 ms", False),
        "",
    )
    blocks = _blocks(view.document())
    texts = [b.text() for b in blocks]
    assert texts[:3] == ["user", "List **two** fruits", "assistant"]  # the user's text is not Markdown
    assert texts[3:] == ["Apple pip bold it", "Pear", "x = 1", "Done <b>raw</b>", "TTFT 5 ms"]
    label = _fragments(blocks[2])
    assert [f.charFormat().fontWeight() for f in label] == [QFont.Bold]
    items = blocks[3:5]
    assert all(b.textList() is not None for b in items) and blocks[5].textList() is None
    pieces = {f.text(): f.charFormat() for f in _fragments(blocks[3])}
    assert pieces["pip"].fontFixedPitch() and pieces["bold"].fontWeight() == QFont.Bold
    assert pieces["it"].fontItalic() and pieces["Apple "].fontWeight() == QFont.Normal
    code = _fragments(blocks[5])[0].charFormat()
    assert code.fontFixedPitch() and blocks[5].blockFormat().background().style() != 0


def test_streamed_markdown_is_rendered_apart_from_the_label_and_throttled(qtbot):
    from opscope.app.chat.session import Turn
    from opscope.app.chat.transcript import RENDER_INTERVAL_MS, ChatTranscript
    from PySide6.QtGui import QFont

    view = ChatTranscript()
    qtbot.addWidget(view)
    view.show_turns([Turn("user", "Fruits?")], lambda t: ("", False), "")
    view.begin_stream()
    text = ""
    for piece in ["1", ".", " Apple", "\n", "2", ".", " Pe", "ar", "\n\n", "`x", "`"]:
        text += piece
        view.stream(text)
    assert view.renders == 0  # nothing re-rendered per token: the throttle collects them
    qtbot.waitUntil(lambda: view.renders == 1, timeout=RENDER_INTERVAL_MS * 20)
    blocks = _blocks(view.document())
    assert [b.text() for b in blocks] == ["user", "Fruits?", "assistant", "Apple", "Pear", "x"]
    assert [f.charFormat().fontWeight() for f in _fragments(blocks[3])] == [QFont.Normal]  # no bleed
    assert blocks[3].textList() is not None and _fragments(blocks[5])[0].charFormat().fontFixedPitch()


def test_live_stats_use_the_engine_definitions(qapp):
    """LiveTimes on the events of a generation gives what engine.events.stats_from_times gives."""
    from opscope.app.chat.session import LiveTimes
    from opscope.app.worker.protocol import event_to_dict
    from opscope.engine.generation.events import PrefillFinished, PrefillStarted, Token, stats_from_times

    events = [
        PrefillStarted(12, 1_100_000, 1_000_000),
        PrefillFinished(12, 9_000_000),
        Token(0, 5, "Hi", 10_000_000),
        Token(1, 6, "", 14_000_000),
        Token(2, 7, "!", 19_000_000),
    ]
    times = LiveTimes()
    assert times.stats() is None
    changed = [times.on_event(event_to_dict(e)) for e in events]
    assert changed == [False, False, True, True, True]
    expected = stats_from_times(
        1_000_000, 1_100_000, 9_000_000, 12, [10_000_000, 14_000_000, 19_000_000], 19_000_000
    ).as_dict()
    assert times.stats() == expected and expected["ttft_ms"] == 9.0 and expected["generated_tokens"] == 3


def test_run_accepts_the_cli_namespace_or_argv():
    import argparse

    from opscope.app.main import _options

    ns = _options(argparse.Namespace(model="m.gguf", db="sqlite:///x.db", debug=True, command="gui"))
    assert (ns.model, ns.db, ns.debug, ns.device, ns.backend) == ("m.gguf", "sqlite:///x.db", True, "cpu", "torch")
    assert _options(["--device", "cuda:0", "--theme", "dark"]).theme == "dark"
    with pytest.raises(SystemExit):
        _options(["--theme", "purple"])


def test_chat_session_exports_markdown_and_json(qapp, tmp_path):
    import json

    from opscope.app.chat.session import ChatSession, Turn, format_stats

    session = ChatSession(client=None)
    session.system_prompt = "Be brief."
    stats = {"ttft_ms": 812.0, "prefill_tok_s": 45.1, "decode_tok_s": 21.3, "prompt_tokens": 30, "generated_tokens": 64}
    session.history = [Turn("user", "Hi"), Turn("assistant", "Hello!", stats, "eos")]
    line = format_stats(stats, "eos")
    assert line == "TTFT 812 ms · prefill 45.1 tok/s · decode 21.3 tok/s · 30 prompt + 64 generated tokens · stop: eos"
    assert format_stats({**stats, "decode_tok_s": None}, "length").count("–") == 1
    md = session.save(tmp_path / "c.md").read_text()
    assert "**user:** Hi" in md and line in md and "**system:** Be brief." in md
    data = json.loads(session.save(tmp_path / "c.json").read_text())
    assert data["system"] == "Be brief." and data["turns"][1]["stats"]["ttft_ms"] == 812.0
    assert session.messages()[0] == {"role": "system", "content": "Be brief."}


def test_after_a_model_switch_the_old_replies_say_which_model_wrote_them(qtbot):
    """Issue 28: the conversation stays on screen across a model switch; each reply's footer then
    names the model that wrote it, and the stats line follows Clear."""
    from opscope.app.chat.panel import ChatPanel
    from opscope.app.chat.session import ChatSession, Turn
    from opscope.app.ui.engine_client import EngineClient

    client = EngineClient()  # never started: the test emits what the worker would report
    session = ChatSession(client)
    panel = ChatPanel(session)
    qtbot.addWidget(panel)
    client.modelChanged.emit({"path": "/models/SmolLM2-135M-Instruct.Q4_1.gguf"})
    stats = {"ttft_ms": 80.0, "prefill_tok_s": 300.0, "decode_tok_s": 20.0, "prompt_tokens": 30, "generated_tokens": 4}
    session.history.append(Turn("user", "Hi"))
    session._on_finished({"text": "Hello!", "stats": stats, "stop_reason": "eos"})  # the worker's reply
    assert "written by" not in panel.transcript.toPlainText()
    client.modelChanged.emit({"path": "/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"})
    assert (
        "stop: eos · written by SmolLM2-135M-Instruct.Q4_1.gguf, not the model loaded now"
        in panel.transcript.toPlainText()
    )
    assert panel.stats_label.text().endswith("written by SmolLM2-135M-Instruct.Q4_1.gguf, not the model loaded now")
    session.clear()
    assert panel.stats_label.text() == "" and "Hello!" not in panel.transcript.toPlainText()
