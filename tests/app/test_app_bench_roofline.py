"""The Benchmarks panel's Roofline tab: once a matmul run is saved (the model's runSaved, which the
worker's end of a run emits), the engine worker computes its roofline (never the GUI thread) and its
points are drawn against the compute and bandwidth ceilings with axis labels in units, and export as
PNG and SVG. The run is a real tiny matmul run in a real store, the worker a real process."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import re

import pytest

pytestmark = [pytest.mark.gui, pytest.mark.usefixtures("one_torch_thread")]


@pytest.fixture
def saved_runs(tmp_path):
    from opscope.engine.bench.ceilings import peaks
    from opscope.engine.bench.measure.options import BenchOptions
    from opscope.engine.bench.session import run_suite
    from opscope.engine.bench.suites import get_suite
    from opscope.engine.core.results import RunResult
    from opscope.engine.store import RunStore

    peaks.record("cpu", "bandwidth", None, 20e9, "test: 20 GB/s")  # a bandwidth roof to draw
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    params = get_suite("matmul").Params(sizes=(32, 48), dtypes=("float32",))
    with RunStore.open(url) as store:
        mm, _ = run_suite("matmul", BenchOptions(quick=True), store, name="mm", params=params)
        kv = store.save(RunResult(kind="kv_cache", name="kv", status="completed"))
    return url, mm, kv


def drawn_ticks(axis) -> list[str]:
    """The tick labels ``axis`` paints now (pyqtgraph drops those that would overlap)."""
    from PySide6.QtGui import QImage, QPainter

    image = QImage(axis.width() or 100, axis.height() or 100, QImage.Format_ARGB32)
    painter = QPainter(image)
    try:
        _axis, _ticks, texts = axis.generateDrawSpecs(painter)
    finally:
        painter.end()
    return [text for _rect, _flags, text in texts]


def test_a_finished_matmul_run_shows_its_roofline_in_the_benchmarks_panel(qtbot, saved_runs, tmp_path):
    from opscope.app.bench.model import BenchModel
    from opscope.app.bench.panel import BenchPanel
    from opscope.app.ui.engine_client import EngineClient

    url, mm, kv = saved_runs
    client = EngineClient()
    panel = BenchPanel(BenchModel(client, url))
    qtbot.addWidget(panel)
    panel.resize(1000, 700)
    panel.show()
    qtbot.waitExposed(panel)
    view = panel.roofline_view
    try:
        _check_roofline(qtbot, panel, view, mm, kv, tmp_path)
    finally:
        client.shutdown()


def _check_roofline(qtbot, panel, view, mm, kv, tmp_path):
    with qtbot.waitSignal(view.computed, timeout=120_000) as drawn:
        panel.model.runSaved.emit(mm)
        assert view.summary.text().startswith("computing roofline…")
    assert drawn.args == [True], view.summary.text()
    assert panel.tabs.currentWidget() is view and view.isVisible()
    roofs, points = view.plot.getPlotItem().listDataItems()[:-1], view.plot.getPlotItem().listDataItems()[-1]
    xs, ys = points.getOriginalDataset()
    assert len(xs) == 2 and sorted(xs) == pytest.approx([32 / 6, 48 / 6])  # 2n³ FLOP over 3·n²·4 bytes
    assert len(roofs) >= 1 and all(y > 0 for y in ys)
    axis = view.plot.getPlotItem().getAxis
    assert axis("bottom").labelText == "arithmetic intensity (FLOP/byte)"
    assert axis("left").labelText == "attained performance"
    # The tick labels a person reads: engineering units, never "10¹¹" or "3·10¹¹"
    qtbot.waitUntil(lambda: bool(drawn_ticks(axis("left")) and drawn_ticks(axis("bottom"))))  # laid out
    left, bottom = drawn_ticks(axis("left")), drawn_ticks(axis("bottom"))
    assert left and all(re.fullmatch(r"\d+(\.\d+)? [kMGTP]?FLOP/s", t) for t in left), left
    assert any(t.endswith("GFLOP/s") for t in left), left
    assert bottom and all(re.fullmatch(r"[\d,]+(\.\d+)?", t) for t in bottom), bottom
    assert {"1", "10"} <= set(bottom), bottom
    assert view.export_png.isEnabled() and view.export_svg.isEnabled()
    view.export(str(tmp_path / "r.svg"))
    view.export(str(tmp_path / "r.png"))
    assert (tmp_path / "r.svg").read_text().startswith("<svg")
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    panel.tabs.setCurrentWidget(panel.chart)
    with qtbot.waitSignal(view.computed, timeout=60_000) as drawn:
        panel.model.runSaved.emit(kv)  # a suite without a roofline leaves the tab where it was
    assert drawn.args == [False] and panel.tabs.currentWidget() is panel.chart
    assert "is a kv_cache run: a roofline places llm, matmul, attention points" in view.summary.text()
    with qtbot.waitSignal(view.computed, timeout=60_000) as drawn:
        panel.model.runSaved.emit(kv + 1000)  # no such run: a visible error line, not a silent tab
    assert drawn.args == [False] and view.summary.text().startswith(f"roofline: cannot compute run {kv + 1000}'s: ")
