"""The Runs panel's Roofline tab on a stored run: points and roofs drawn, PNG and SVG export."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest
from opscope.engine.core.results import Metric, RunResult

pytestmark = [pytest.mark.gui]


def _matmul_run():
    th = {
        "value": 500e9,
        "source": "test",
        "basis": "theoretical",
        "kind": "matmul",
        "dtype": "float32",
        "label": "theoretical 500 GFLOP/s",
    }
    return RunResult(
        kind="matmul",
        name="mm",
        metrics=[
            Metric("matmul_float32_256", "GFLOP/s", [100.0], params={"n": 256, "dtype": "float32"}),
            Metric("matmul_float32_64", "GFLOP/s", [10.0], params={"n": 64, "dtype": "float32"}),
        ],
        settings={
            "device": "cpu",
            "dtype": "float32",
            "suite_params": {"peaks": {"float32": {"theoretical": th, "measured": None}}},
        },
    )


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

    pts = [
        RoofPoint(name=n, suite="llm", intensity=i, flop_s=f)
        for n, i, f in [("pp512", 40.0, 90e9), ("pp512@d64", 42.0, 85e9), ("tg128", 1.0, 5e9)]
    ]
    roof = Roofline(
        run="r",
        kind="llm",
        device="cpu",
        dtype="float32",
        points=pts,
        ceilings=[Ceiling(kind="compute", basis="theoretical", value=200e9, label="200 GFLOP/s", origin="test")],
    )
    view = RooflineView()
    qtbot.addWidget(view)
    view._draw(roof)
    names = sorted(i.toPlainText() for i in view.plot.getPlotItem().items if isinstance(i, pg.TextItem))
    assert names == ["pp512, pp512@d64", "tg128"]  # 0.02 decades apart: one name for both, never one left unnamed
    view.resize(900, 600)
    view.show()
    qtbot.waitExposed(view)
    assert view.plot.getAxis("left").labelString().find("x1e") == -1


def _llm_run():
    """Six llm points as the suite stores them; pp64 and pp64@d64 land on the same spot."""
    work = {
        "pp16": (1e9, 4e8),
        "pp64": (1e9, 1e8),
        "pp64@d64": (1e9, 1e8),
        "pp256": (1e9, 3e7),
        "tg16": (1e9, 1e9),
        "tg16@d64": (1e9, 1.1e9),
    }
    rates = {"pp16": 40.0, "pp64": 100.0, "pp64@d64": 100.0, "pp256": 150.0, "tg16": 12.0, "tg16@d64": 11.0}
    th = {
        "value": 500e9,
        "source": "test",
        "basis": "theoretical",
        "kind": "matmul",
        "dtype": "float32",
        "label": "theoretical 500 GFLOP/s",
    }
    return RunResult(
        kind="llm",
        name="llm-run",
        metrics=[Metric(n, "tok/s", [r, r, r]) for n, r in rates.items()],
        settings={
            "device": "cpu",
            "dtype": "float32",
            "suite_params": {
                "peaks": {"flop": {"theoretical": th, "measured": None}, "bytes": {}},
                "roofline": {n: {"flop": f, "bytes": b} for n, (f, b) in work.items()},
            },
        },
    )


@pytest.fixture
def llm_db(tmp_path, monkeypatch):
    """A store with an llm run and no bandwidth ceiling anywhere (none theoretical, none measured)."""
    from opscope.engine.bench.ceilings import peaks
    from opscope.engine.store import RunStore

    monkeypatch.setenv("OPSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(peaks, "theoretical", lambda *a, **k: None)
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    with RunStore.open(url) as store:
        run_id = store.save(_llm_run())
    return url, run_id


def _drawn(qtbot, url, run_id):
    from opscope.app.runs.roofline import RooflineView
    from opscope.app.worker.jobs import stored_roofline
    from opscope.engine import Roofline

    view = RooflineView()
    qtbot.addWidget(view)
    view.resize(1000, 520)
    view.show()
    qtbot.waitExposed(view)
    view.show_roof(Roofline.from_dict(stored_roofline(run_id, url)["roofline"]))  # what the worker sends
    qtbot.wait(50)  # laid out and painted: the names sit where they are drawn
    return view


def test_the_memory_roof_comes_from_the_stored_bandwidth_run(qtbot, llm_db):
    from opscope.engine.store import RunStore

    url, run_id = llm_db
    with RunStore.open(url) as store:
        store.save(
            RunResult(
                kind="bandwidth",
                name="bw-run",
                settings={"device": "cpu"},
                metrics=[Metric("copy_256MiB", "GB/s", [18.0, 20.0, 19.0])],
            )
        )
    view = _drawn(qtbot, url, run_id)
    bandwidth = view.roof.best("bandwidth")
    assert bandwidth.value == pytest.approx(19e9) and bandwidth.origin == "bandwidth run bw-run"
    assert "bandwidth ceiling: measured 19.00 GB/s (bandwidth run bw-run)" in view.summary.text()
    assert "no bandwidth ceiling" not in view.summary.toolTip()
    assert {p.name: p.bound for p in view.roof.points if p.name.startswith("tg")} == {
        "tg16": "memory",
        "tg16@d64": "memory",
    }
    assert view.roof.ridge == pytest.approx(500e9 / 19e9)


def test_without_a_bandwidth_run_a_short_probe_gives_the_memory_roof(qtbot, llm_db):
    view = _drawn(qtbot, *llm_db)
    bandwidth = view.roof.best("bandwidth")
    assert bandwidth is not None and bandwidth.value > 1e8 and bandwidth.label.endswith("(short probe)")
    assert "bandwidth ceiling: measured" in view.summary.text() and "64 MiB copy just now" in view.summary.text()
    assert len(view.plot.getPlotItem().listDataItems()) == 2  # the two roofs as one line, and the points


def test_every_point_is_named_once_and_no_names_overlap(qtbot, llm_db):
    """6 points, 4 names, pp64 and pp64@d64 sharing one: each point is named, coinciding ones
    together, and no two names print over each other."""
    view = _drawn(qtbot, *llm_db)
    texts = [label.textItem.toPlainText() for label in view.labels]
    names = [n for t in texts for n in t.split(", ")]
    assert sorted(names) == sorted(p.name for p in view.roof.points)
    assert "pp64, pp64@d64" in texts
    rects = [label.sceneBoundingRect() for label in view.labels]
    for i, a in enumerate(rects):
        for b in rects[i + 1 :]:
            assert not a.intersects(b), texts


def _matmul_roof():
    """The Runs roofline of docs/screenshots/roofline-1280x800.png: six float32 matmul points
    between 60 and 110 GFLOP/s under a 320 GFLOP/s / 9.9 GB/s roof."""
    from opscope.engine.bench.ceilings.roofline import Ceiling, Roofline, RoofPoint

    rates = {64: 58e9, 128: 68e9, 256: 80e9, 512: 90e9, 1024: 98e9, 2048: 110e9}
    return Roofline(
        run="matmul-baseline",
        kind="matmul",
        device="cpu",
        dtype="float32",
        points=[
            RoofPoint(name=f"matmul_float32_{n}", suite="matmul", intensity=n / 6, flop_s=f) for n, f in rates.items()
        ],
        ceilings=[
            Ceiling(kind="compute", basis="theoretical", value=320e9, label="320 GFLOP/s", origin="test"),
            Ceiling(kind="bandwidth", basis="measured", value=9.9e9, label="9.9 GB/s", origin="test"),
        ],
    )


def _roofline_at_1280x800(qtbot):
    from opscope.app.runs.roofline import RooflineView

    view = RooflineView()
    qtbot.addWidget(view)
    view.resize(776, 420)  # the Roofline tab of the Runs dock in a 1280x800 window
    view.show()
    qtbot.waitExposed(view)
    view.show_roof(_matmul_roof())
    qtbot.waitUntil(lambda: not view._rekey_timer.isActive())
    qtbot.wait(50)
    return view


def _tick_labels(axis) -> list[tuple[str, object]]:
    """(text, rect) of every tick label the axis draws now."""
    from PySide6.QtGui import QImage, QPainter

    image = QImage(10, 10, QImage.Format_ARGB32)
    painter = QPainter(image)
    try:
        _axis, _ticks, texts = axis.generateDrawSpecs(painter)
    finally:
        painter.end()
    return [(text, rect) for rect, _flags, text in texts if text]


def test_at_1280x800_the_y_tick_labels_do_not_crowd(qtbot):
    """60, 70, 80, 90 and 100 GFLOP/s printed over each other, and 9 over 10 GFLOP/s: a minor tick
    is labelled only where its label has room, the decades always."""
    view = _roofline_at_1280x800(qtbot)
    labels = _tick_labels(view.plot.getAxis("left"))
    texts = [t for t, _r in labels]
    assert {"10 GFLOP/s", "100 GFLOP/s"} <= set(texts)
    for i, (a, ra) in enumerate(labels):
        for b, rb in labels[i + 1 :]:
            assert not ra.intersects(rb), (a, b)


def test_at_1280x800_every_matmul_point_is_named(qtbot):
    """One of the six matmul names was left off for lack of room beside its neighbours: the start
    they share is said once in the key, and each point is named by the rest."""
    view = _roofline_at_1280x800(qtbot)
    names = [n for label in view.labels for n in label.textItem.toPlainText().split(", ")]
    assert sorted(names, key=int) == ["64", "128", "256", "512", "1024", "2048"]
    assert "● measured points: matmul_float32_…" in view.plot.getPlotItem().titleLabel.item.toPlainText()
    rects = [label.sceneBoundingRect() for label in view.labels]
    for i, a in enumerate(rects):
        for b in rects[i + 1 :]:
            assert not a.intersects(b)


def test_in_the_benchmarks_tab_the_key_is_not_cut(qtbot):
    """Beside the Benchmarks form (a 455 px plot at 1400x900) the key read "theoretical compute
    640.0 GFLOP/s / measured bandwidt": one roof's key wider than the plot never wrapped."""
    from opscope.app.runs.roofline import RooflineView

    view = RooflineView()
    qtbot.addWidget(view)
    view.resize(455, 380)
    view.show()
    qtbot.waitExposed(view)
    view.show_roof(_matmul_roof())
    qtbot.waitUntil(lambda: not view._rekey_timer.isActive())
    qtbot.wait(50)
    title = view.plot.getPlotItem().titleLabel
    text = title.item.toPlainText()
    assert "theoretical compute 320.0 GFLOP/s /" in text and "measured bandwidth 9.900 GB/s" in text
    shown = title.mapRectToScene(title.item.mapRectToParent(title.item.boundingRect()))
    assert 0 <= shown.left() and shown.right() <= view.plot.width()
    assert title.item.boundingRect().height() <= title.size().height() + 4  # every line of it in its row
