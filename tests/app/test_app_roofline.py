"""The Runs panel's Roofline tab on a stored run: points and roofs drawn, PNG and SVG export."""
from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest

from opscope.engine.core.results import Metric, RunResult

pytestmark = [pytest.mark.gui]


def _matmul_run():
    th = {"value": 500e9, "source": "test", "basis": "theoretical", "kind": "matmul", "dtype": "float32",
          "label": "theoretical 500 GFLOP/s"}
    return RunResult(kind="matmul", name="mm", metrics=[
        Metric("matmul_float32_256", "GFLOP/s", [100.0], params={"n": 256, "dtype": "float32"}),
        Metric("matmul_float32_64", "GFLOP/s", [10.0], params={"n": 64, "dtype": "float32"})],
        settings={"device": "cpu", "dtype": "float32",
                  "suite_params": {"peaks": {"float32": {"theoretical": th, "measured": None}}}})


@pytest.fixture
def db(tmp_path, monkeypatch):
    from opscope.engine.bench.ceilings import peaks
    from opscope.engine.store import RunStore

    monkeypatch.setenv("OPSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    peaks.record("cpu", "bandwidth", None, 20e9, "test: 20 GB/s")
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    with RunStore.open(url) as store:
        store.save(_matmul_run())
        store.save(RunResult(kind="kv_cache", name="kv"))
    return url


def test_roofline_tab_draws_points_and_roofs_and_exports(qtbot, db, tmp_path):
    from opscope.app.runs.model import RunsModel
    from opscope.app.runs.panel import RunsPanel

    model = RunsModel(db)
    panel = RunsPanel(model)
    qtbot.addWidget(panel)
    panel.refresh()
    ids = {panel.table.item(r, 1).text(): panel.table.item(r, 0).data(0x0100) for r in range(panel.table.rowCount())}
    panel.select_ids([ids["mm"]])
    panel.roofline_selected()
    view = panel.roofline_view
    assert panel.tabs.currentWidget() is view
    items = view.plot.getPlotItem().listDataItems()
    assert len(items) == 2  # one roof (theoretical compute / measured bandwidth) and the points
    xs, ys = items[1].getOriginalDataset()
    assert sorted(xs) == pytest.approx([64 / 6, 256 / 6]) and sorted(ys) == pytest.approx([10e9, 100e9])
    assert "ridge point: 25.00 FLOP/byte" in view.summary.text()
    view.export(str(tmp_path / "r.svg"))
    view.export(str(tmp_path / "r.png"))
    assert (tmp_path / "r.svg").read_text().startswith("<svg")
    assert (tmp_path / "r.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    panel.select_ids([ids["kv"]])
    panel.roofline_selected()
    assert "a roofline places llm, matmul, attention points" in view.summary.text()
    assert not view.export_png.isEnabled()
    model.close()


def test_point_names_do_not_print_over_each_other_and_axes_are_not_rescaled(qtbot):
    import pyqtgraph as pg

    from opscope.app.runs.roofline import RooflineView
    from opscope.engine.bench.ceilings.roofline import Ceiling, Roofline, RoofPoint

    pts = [RoofPoint(name=n, suite="llm", intensity=i, flop_s=f) for n, i, f in
           [("pp512", 40.0, 90e9), ("pp512@d64", 42.0, 85e9), ("tg128", 1.0, 5e9)]]
    roof = Roofline(run="r", kind="llm", device="cpu", dtype="float32", points=pts,
                    ceilings=[Ceiling(kind="compute", basis="theoretical", value=200e9, label="200 GFLOP/s",
                                      origin="test")])
    view = RooflineView()
    qtbot.addWidget(view)
    view._draw(roof)
    names = sorted(i.toPlainText() for i in view.plot.getPlotItem().items if isinstance(i, pg.TextItem))
    assert names == ["pp512", "tg128"]  # pp512@d64 sits 0.02 decades from pp512: unnamed on the plot
    view.resize(900, 600)
    view.show()
    qtbot.waitExposed(view)
    assert view.plot.getAxis("left").labelString().find("x1e") == -1
