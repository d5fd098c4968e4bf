"""Trace, Benchmarks and Runs in the real window with the real engine worker, plus the screenshots
of every panel that a person looks at.

The screenshots go to the test's tmp dir; `make screenshots` sets OPSCOPE_SCREENSHOT_DIR to
docs/screenshots to regenerate the documentation's pictures (tests never write into the tree).
One window (one worker, one model load) serves the module."""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest

pytestmark = [pytest.mark.gui, pytest.mark.slow]

TINY_MATMUL = {"sizes": [64], "dtypes": ["float32"]}


@pytest.fixture(scope="module")
def window(qapp, tmp_path_factory):
    from app_testing import open_window

    win = open_window(qapp, tmp_path_factory.mktemp("gui-panels"))
    yield win
    from app_testing import close_window

    close_window(win)


def _trace(qtbot, window, variant="leaky-norm"):
    panel = window.panels["trace"]
    if panel.model.report is not None and (panel.model.result or {}).get("variant") == variant:
        return panel
    window.docks["trace"].raise_()
    panel.variant.setCurrentText(variant)
    panel.target.setCurrentIndex(panel.target.findData("meta"))
    panel.tokens.setValue(2)
    with qtbot.waitSignal(panel.model.finished, timeout=300_000):
        panel.run_button.click()
    return panel


def _prepare_bench(qtbot, window, name, params=TINY_MATMUL, suite="matmul"):
    panel = window.panels["bench"]
    qtbot.waitUntil(lambda: panel.suite_combo.count() > 0, timeout=60_000)
    window.docks["bench"].raise_()
    panel.suite_combo.setCurrentText(suite)
    panel.quick.setChecked(True)
    for key, value in params.items():
        panel.params.editors[key].setText(", ".join(map(str, value)))
    panel.name_edit.setText(name)
    panel.tags_edit.setText("gui-test")
    qtbot.waitExposed(panel)
    return panel


def _bench(qtbot, window, name, params=TINY_MATMUL, suite="matmul", meter=None):
    panel = _prepare_bench(qtbot, window, name, params, suite)
    if meter is not None:
        meter.start()
    with qtbot.waitSignal(panel.model.finished, timeout=300_000) as blocker:
        panel.run_button.click()
    return blocker.args[0]


def test_trace_shows_the_planted_bug_findings(qtbot, window, tmp_path):
    panel = _trace(qtbot, window)
    report = panel.model.report
    assert report["target"] == "meta" and report["findings"]
    titles = [panel.findings.item(i).text() for i in range(panel.findings.count())]
    assert any("[fallback]" in t and "attn_norm" in t for t in titles)
    assert int(panel.cards["fallbacks"].value.text().replace(",", "")) > 0
    assert panel.cards["fallbacks"].property("severity") == "bad"
    total = panel.model.ops.total
    panel.findings.setCurrentRow(0)  # click the finding: the table shows its ops
    shown = panel.model.ops.rowCount()
    assert 0 < shown < total
    rows = [panel.model.ops.row_dict(r) for r in range(0, shown, max(shown // 50, 1))]
    assert all(r["source"].startswith("engine/trace/planted.py") or "norm" in r["module"] for r in rows)
    detail = panel.finding_detail.toPlainText()
    assert "planted.py" in detail and "Fix:" in detail
    assert {"cpu", "meta"} <= set(panel.timeline.lanes)
    out = panel.model.export_perfetto(str(tmp_path / "t.json"))
    trace = json.loads(Path(out).read_text())
    assert trace["traceEvents"] and trace["otherData"]["target"] == "meta"


def test_trace_table_filters_by_device_and_class(qtbot, window):
    panel = _trace(qtbot, window)
    panel.findings.setCurrentRow(-1)
    panel.device_filter.setCurrentIndex(panel.device_filter.findData("cpu"))
    cpu = panel.model.ops.rowCount()
    assert cpu > 0 and all(panel.model.ops.row_dict(r)["device"] == "cpu" for r in range(min(cpu, 100)))
    panel.kind_filter.setCurrentIndex(panel.kind_filter.findData("fallback"))
    assert 0 < panel.model.ops.rowCount() <= cpu
    assert f"of {panel.model.ops.total:,} ops" in panel.count_label.text()
    panel.device_filter.setCurrentIndex(0)
    panel.kind_filter.setCurrentIndex(0)


def test_tiny_benchmark_runs_to_completion_and_appears_in_runs(qtbot, window):
    from opscope.app.ui.stallmeter import StallMeter

    meter = StallMeter(10)
    panel = window.panels["bench"]
    try:
        # The roofline comes after the save: the worker reads the run and imports torch for it, and
        # the window must stay responsive through that too (it froze for seconds when the GUI did).
        with qtbot.waitSignal(panel.roofline_view.computed, timeout=120_000) as drawn:
            result = _bench(qtbot, window, "gui-matmul-a", meter=meter)
            assert panel.roofline_view.summary.text().startswith("computing roofline…")
    finally:
        meter.stop()
    assert drawn.args == [True] and panel.tabs.currentWidget() is panel.roofline_view
    assert panel.roofline_view.roof.run == "gui-matmul-a" and panel.roofline_view.roof.points
    assert result["status"] == "completed" and result["metrics"] >= 1
    assert panel.table.rowCount() >= 1 and "saved as run “gui-matmul-a”" in panel.status.text()
    assert panel.progress.value() == 1000 and panel.progress.text().startswith("1 / 1 points")
    assert panel.table.item(0, 2).text().endswith(" GFLOP/s")  # the median with its unit
    runs = window.panels["runs"]
    qtbot.waitUntil(lambda: any(r.info.name == "gui-matmul-a" for r in runs.rows), timeout=10_000)
    stored = runs.model.load(result["run_id"])
    assert stored.info.status == "completed" and "gui-test" in stored.info.tags
    assert stored.result.telemetry, "the GUI attaches the run's telemetry window"


@pytest.mark.perf  # a timing claim: true on a quiet machine (`make perf-check`), not beside a parallel worker
def test_the_window_stays_responsive_through_a_benchmark_and_its_roofline(qtbot, window):
    """The roofline comes after the save: the worker reads the run and imports torch for it, and the
    window must stay responsive through that too (it froze for seconds when the GUI did)."""
    from opscope.app.ui.stallmeter import StallMeter

    meter = StallMeter(10)
    panel = window.panels["bench"]
    try:
        with qtbot.waitSignal(panel.roofline_view.computed, timeout=120_000):
            _bench(qtbot, window, "gui-matmul-stall", meter=meter)
    finally:
        meter.stop()
    assert meter.max_blocked_ms < 100, meter.summary()


def test_the_runs_panel_has_the_engine_compute_a_roofline(qtbot, window):
    runs = window.panels["runs"]
    qtbot.waitUntil(lambda: any(r.info.name == "gui-matmul-a" for r in runs.rows), timeout=10_000)
    window.docks["runs"].raise_()
    runs.select_ids([next(r.info.id for r in runs.rows if r.info.name == "gui-matmul-a")])
    with qtbot.waitSignal(runs.roofline_view.computed, timeout=120_000) as drawn:
        runs.roofline_selected()
        assert runs.roofline_view.summary.text().startswith("computing roofline…")
        assert runs.tabs.currentWidget() is runs.roofline_view
    assert drawn.args == [True] and runs.roofline_view.roof.run == "gui-matmul-a"


def test_benchmark_cancel_keeps_the_run_as_aborted(qtbot, window):
    panel = window.panels["bench"]
    window.docks["bench"].raise_()
    panel.suite_combo.setCurrentText("matmul")
    panel.params.editors["sizes"].setText("64, 96, 128, 192, 256")
    panel.name_edit.setText("gui-cancelled")
    with qtbot.waitSignal(panel.model.point, timeout=300_000):
        panel.run_button.click()
    with qtbot.waitSignal(panel.model.failed, timeout=120_000):
        panel.cancel_button.click()
    assert "cancelled" in panel.status.text()
    runs = window.panels["runs"]
    qtbot.waitUntil(lambda: any(r.info.name == "gui-cancelled" for r in runs.rows), timeout=10_000)
    info = next(r.info for r in runs.rows if r.info.name == "gui-cancelled")
    assert info.status == "aborted" and info.metric_count >= 1


def test_a_chat_message_sent_during_a_benchmark_says_it_waits(qtbot, window):
    panel = _prepare_bench(qtbot, window, "gui-while-chat", {"sizes": [64, 96, 128, 192, 256], "dtypes": ["float32"]})
    chat = window.chat
    with qtbot.waitSignal(panel.model.point, timeout=300_000):
        panel.run_button.click()
    chat.sampling.max_tokens.setValue(3)
    chat.input.setPlainText("Hi")
    chat.send_button.click()
    assert chat.progress.isVisible() and chat.progress.format() == "Waiting for the benchmark to finish…"
    with qtbot.waitSignal(chat.session.replyFinished, timeout=300_000):
        pass
    assert not panel.model.busy  # the engine runs one job at a time: the benchmark went first
    assert chat.session.history[-1].stats["generated_tokens"] >= 1
    window.chat_session.clear()


def _two_runs(qtbot, window) -> list[int]:
    runs = window.panels["runs"]
    names = {r.info.name: r.info.id for r in runs.rows}
    for name in ("gui-matmul-a", "gui-matmul-b"):
        if name not in names:
            names[name] = _bench(qtbot, window, name)["run_id"]
    runs.refresh()
    return [names["gui-matmul-a"], names["gui-matmul-b"]]


def test_comparing_two_runs_shows_the_table(qtbot, window):
    ids = _two_runs(qtbot, window)
    runs = window.panels["runs"]
    window.docks["runs"].raise_()
    runs.select_ids(ids)
    runs.compare_selected()
    view = runs.compare_view
    assert view.table.rowCount() >= 1
    headers = [view.table.horizontalHeaderItem(c).text() for c in range(view.table.columnCount())]
    assert headers[:4] == ["metric", "unit", "gui-matmul-a", "gui-matmul-b"] and headers[4] == "Δ gui-matmul-b"
    delta = view.table.item(0, 4).text()
    assert delta.startswith(("~", "+", "-")) and "p=" in view.table.item(0, 4).toolTip()  # p and n on hover
    assert view.distributions.getPlotItem().listDataItems()


@pytest.fixture
def screenshots(tmp_path) -> Path:
    folder = Path(os.environ.get("OPSCOPE_SCREENSHOT_DIR") or tmp_path / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _shoot(qtbot, window, dock: str, name: str, folder: Path) -> Path:
    from PySide6.QtWidgets import QApplication

    window.docks[dock].raise_()
    qtbot.waitExposed(window)
    QApplication.processEvents()  # let pending layout requests (axis widths, splitters) settle
    QApplication.processEvents()
    path = folder / f"{name}.png"
    assert window.grab().save(str(path)) and path.stat().st_size > 10_000
    return path


def _chat_reply(qtbot, chat, text: str) -> None:
    chat.sampling.temperature.setValue(0.0)
    chat.sampling.max_tokens.setValue(40)
    chat.input.setPlainText(text)
    with qtbot.waitSignal(chat.session.replyFinished, timeout=180_000):
        chat.send_button.click()


def _chat_streaming_shot(qtbot, window, folder: Path) -> None:
    """chat-streaming.png: a Markdown reply while it streams, its live TTFT and tok/s under it."""
    chat = window.chat
    chat.sampling.temperature.setValue(0.0)
    chat.sampling.max_tokens.setValue(60)
    chat.input.setPlainText("Write a Python function that reverses a string, in a code block.")
    live = []
    chat.session.liveStats.connect(live.append)
    with qtbot.waitSignal(chat.session.replyFinished, timeout=180_000):
        chat.send_button.click()
        qtbot.waitUntil(lambda: len(live) >= 35, timeout=180_000)  # a few lines of Markdown
        assert "generating" in chat.stats_label.text() and "tok/s" in chat.stats_label.text()
        _shoot(qtbot, window, "chat", "chat-streaming", folder)


def test_screenshots_of_every_panel(qtbot, window, screenshots):
    """PNGs a person looks at: {chat-streaming,chat,telemetry,trace,benchmarks,runs,compare,dark-theme,
    dark-runs,dark-chat,settings,store-switch}.png."""
    shoot = lambda dock, name: _shoot(qtbot, window, dock, name, screenshots)  # noqa: E731
    _chat_streaming_shot(qtbot, window, screenshots)  # its code block stays in chat.png and dark-chat.png
    _chat_reply(qtbot, window.chat, "Give me three tips for writing fast Python code.")
    shoot("chat", "chat")
    telemetry = window.panels["telemetry"]
    telemetry.refresh(force=True)
    assert telemetry.curves and any(b[0] == "decode" for b in telemetry.bands["cpu"].bands)
    from PySide6.QtCore import Qt

    window.resizeDocks([window.docks["chat"], window.docks["telemetry"]], [500, 900], Qt.Horizontal)
    shoot("chat", "telemetry")
    window.reset_layout()
    trace = _trace(qtbot, window)
    trace.findings.setCurrentRow(0)
    shoot("trace", "trace")
    _assert_trace_readable_in(window)
    ids = _two_runs(qtbot, window)
    shoot("bench", "benchmarks")
    runs = window.panels["runs"]
    runs.select_ids(ids[:1])
    runs.open_selected()
    shoot("runs", "runs")
    runs.select_ids(ids)
    runs.compare_selected()
    shoot("runs", "compare")
    window.theme.set_mode("dark")
    try:
        shoot("trace", "dark-theme")
        shoot("runs", "dark-runs")
        shoot("chat", "dark-chat")
    finally:
        window.theme.set_mode("light")
    _settings_and_store_shots(qtbot, window, screenshots, ids)


def _assert_trace_readable_in(window) -> None:
    """In the real 1400x900 window: the findings list and every labelled filter lie inside the window."""
    from PySide6.QtCore import QPoint, QRect

    trace = window.panels["trace"]

    def inside(widget) -> bool:
        return widget.isVisible() and window.rect().contains(QRect(widget.mapTo(window, QPoint(0, 0)), widget.size()))

    assert window.width() == 1400 and window.height() == 900
    assert (
        inside(trace.findings) and trace.findings.viewport().height() >= 4 * trace.findings.fontMetrics().lineSpacing()
    )
    item = trace.findings.item(0)
    assert trace.findings.viewport().rect().contains(trace.findings.visualItemRect(item))  # the whole title shows
    for name, label in trace.filter_labels.items():
        assert inside(label) and inside(label.buddy()), name


def _settings_and_store_shots(qtbot, window, folder: Path, ids: list[int]) -> None:
    """settings.png (Engine → Settings…) and store-switch.png (the Runs panel on a team store)."""
    from PySide6.QtWidgets import QApplication

    dialog = window.open_engine_settings()
    qtbot.waitExposed(dialog)
    QApplication.processEvents()
    assert dialog.grab().save(str(folder / "settings.png"))
    dialog.reject()
    runs = window.panels["runs"]
    team = folder.parent / "team-store.sqlite" if "OPSCOPE_SCREENSHOT_DIR" not in os.environ else None
    import tempfile

    team = team or Path(tempfile.mkdtemp(prefix="opscope-team-")) / "team.sqlite"
    local = runs.model.db_url
    runs.select_ids(ids)
    assert runs.push_selected(str(team)).pushed
    try:
        assert runs.open_store(str(team)) and "team" in runs.store_label.text()
        runs.select_ids([runs.rows[0].info.id])
        runs.open_selected()
        _shoot(qtbot, window, "runs", "store-switch", folder)
    finally:
        runs.open_store(local)


def test_the_window_fits_a_1024x640_screen_with_nothing_cut(qtbot, window):
    """A small laptop screen: the window shrinks to 1024x640, the telemetry plots (and their
    wrapped keys) stay inside their dock, and every panel's main buttons lie inside the window."""
    from PySide6.QtCore import QPoint, QRect

    def inside(widget) -> bool:
        at = widget.mapTo(window, QPoint(0, 0))
        return widget.isVisible() and window.rect().contains(QRect(at, widget.size()))

    telemetry = window.panels["telemetry"]
    try:
        window.resize(1024, 640)
        qtbot.waitUntil(lambda: (window.width(), window.height()) == (1024, 640))
        view = telemetry.graphics
        qtbot.waitUntil(lambda: view.ci.geometry().width() <= view.viewport().width())  # no plot cut at the edge
        for key, plot in telemetry.plots.items():
            assert plot.titleLabel.item.boundingRect().width() <= view.viewport().width(), key
        for dock, buttons in (
            ("chat", ("send_button", "stop_button")),
            ("bench", ("run_button", "cancel_button")),
            ("trace", ("run_button", "script_button")),
        ):
            window.docks[dock].raise_()
            panel = window.chat if dock == "chat" else window.panels[dock]
            qtbot.waitUntil(lambda p=panel: p.isVisible())
            for name in buttons:
                assert inside(getattr(panel, name)), (dock, name)
    finally:
        window.resize(1400, 900)
        window.docks["chat"].raise_()


def test_diagnose_shows_the_top_finding_of_the_loaded_model(qtbot, window):
    panel = window.panels["trace"]
    window.docks["trace"].raise_()
    panel.variant.setCurrentText("leaky-norm")
    panel.target.setCurrentIndex(panel.target.findData("meta"))
    assert not panel.diagnosis.isVisible()
    with qtbot.waitSignal(panel.diagnose_model.finished, timeout=300_000):
        panel.diagnose_button.click()
    lines = panel.diagnosis.toPlainText().splitlines()
    assert panel.diagnosis.isVisible()
    assert lines[0].startswith("diagnose SmolLM2-135M") and lines[0].endswith("bound: not timed (simulated device)")
    assert lines[1].startswith("1. [high] placement: layers.*.attn_norm, layers.*.mlp_norm, norm: compute runs on cpu")
    assert lines[2].startswith("   at layers.*.attn_norm, layers.*.mlp_norm, norm at engine/trace/planted.py:")
    assert lines[-1].startswith("saved as run ") and "(diagnosis-" in lines[-1]
    assert panel.status.text() == lines[0]


def _diagnoses(window) -> list[str]:
    from opscope.engine import RunStore

    with RunStore.open(window.db_url) as store:
        return [r.name for r in store.list(kind="diagnosis", limit=100)]


def test_stop_while_diagnosing_cancels_it_saves_nothing_and_frees_the_worker(qtbot, window):
    panel = window.panels["trace"]
    window.docks["trace"].raise_()
    panel.variant.setCurrentText("clean")
    panel.target.setCurrentIndex(panel.target.findData(""))  # as loaded: traced, then timed
    saved = _diagnoses(window)
    with qtbot.waitSignal(panel.diagnose_model.stage, timeout=300_000) as first:
        panel.diagnose_button.click()
    assert first.args == ["tracing a prefill of 32 tokens and 3 decode steps"]
    assert panel.status.text() == "diagnosing the loaded model: tracing a prefill of 32 tokens and 3 decode steps…"
    assert panel.diagnose_button.text() == "Stop"
    with qtbot.waitSignal(panel.diagnose_model.cancelled, timeout=120_000):
        panel.diagnose_button.click()
    assert panel.status.text() == "diagnosis cancelled; nothing was saved"
    assert (panel.diagnose_button.text(), panel.diagnose_button.isEnabled()) == ("Diagnose", True)
    assert _diagnoses(window) == saved
    assert not [n.message for n in window.notifier.history if n.level == "error" and "diagnos" in n.message]
    # the worker is free: the next job runs at once and ends
    panel.tokens.setValue(2)
    with qtbot.waitSignal(panel.model.finished, timeout=300_000):
        panel.run_button.click()
    assert panel.status.text().startswith("clean model on cpu: ")
