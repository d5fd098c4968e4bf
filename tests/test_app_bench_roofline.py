"""The Benchmarks panel's Roofline tab: once a matmul run is saved (the model's runSaved, which the
worker's end of a run emits), its points are drawn against the compute and bandwidth ceilings with
axis labels in units, and export as PNG and SVG. The run is a real tiny matmul run in a real store."""
from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest

pytestmark = [pytest.mark.gui, pytest.mark.usefixtures("one_torch_thread")]


@pytest.fixture
def saved_runs(tmp_path):
    from opscope.engine.bench import peaks
    from opscope.engine.bench.options import BenchOptions
    from opscope.engine.bench.session import run_suite
    from opscope.engine.bench.suites import get_suite
    from opscope.engine.results import RunResult
    from opscope.engine.store import RunStore

    peaks.record("cpu", "bandwidth", None, 20e9, "test: 20 GB/s")  # a bandwidth roof to draw
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    params = get_suite("matmul").Params(sizes=(32, 48), dtypes=("float32",))
    with RunStore.open(url) as store:
        mm, _ = run_suite("matmul", BenchOptions(quick=True), store, name="mm", params=params)
        kv = store.save(RunResult(kind="kv_cache", name="kv", status="completed"))
    return url, mm, kv


def test_a_finished_matmul_run_shows_its_roofline_in_the_benchmarks_panel(qtbot, saved_runs, tmp_path):
    from opscope.app.bench.model import BenchModel
    from opscope.app.bench.panel import BenchPanel

    url, mm, kv = saved_runs
    panel = BenchPanel(BenchModel(None, url))
    qtbot.addWidget(panel)
    panel.resize(1000, 700)
    panel.show()
    qtbot.waitExposed(panel)
    panel.model.runSaved.emit(mm)
    view = panel.roofline_view
    assert panel.tabs.currentWidget() is view and view.isVisible()
    roofs, points = view.plot.getPlotItem().listDataItems()[:-1], view.plot.getPlotItem().listDataItems()[-1]
    xs, ys = points.getOriginalDataset()
    assert len(xs) == 2 and sorted(xs) == pytest.approx([32 / 6, 48 / 6])  # 2n³ FLOP over 3·n²·4 bytes
    assert len(roofs) >= 1 and all(y > 0 for y in ys)
    axis = view.plot.getPlotItem().getAxis
    assert axis("bottom").labelText == "arithmetic intensity (FLOP/byte)" and axis("left").labelText == "FLOP/s"
    assert view.export_png.isEnabled() and view.export_svg.isEnabled()
    view.export(str(tmp_path / "r.svg"))
    view.export(str(tmp_path / "r.png"))
    assert (tmp_path / "r.svg").read_text().startswith("<svg")
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    panel.tabs.setCurrentWidget(panel.chart)
    panel.model.runSaved.emit(kv)  # a suite without a roofline leaves the tab where it was
    assert panel.tabs.currentWidget() is panel.chart
