"""What a person reads at 1400x900 in either theme: units on axes, cells and readouts, comparable
CPU scales, whole-number histogram ticks, empty states that say why, titles readable in dark."""

from __future__ import annotations

import os
from datetime import UTC, datetime

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest
from opscope.engine.core.clock import now_ns
from opscope.engine.core.results import Metric, RunResult
from opscope.engine.store.convert import RunInfo, StoredRun

pytestmark = pytest.mark.gui


def _stored(run_id: int, name: str, metrics: list[Metric], telemetry=()) -> StoredRun:
    info = RunInfo(
        id=run_id,
        name=name,
        kind="llm",
        status="completed",
        tags=(),
        notes="",
        created_at=datetime(2026, 11, 23, tzinfo=UTC),
        finished_at=None,
        error=None,
        metric_count=len(metrics),
    )
    return StoredRun(info, RunResult(kind="llm", name=name, metrics=metrics, telemetry=list(telemetry)))


def _tick_values(plot, axis: str) -> list[float]:
    ax = plot.getAxis(axis)
    lo, hi = plot.vb.viewRange()[1 if axis == "left" else 0]
    return [v for _spacing, values in ax.tickValues(lo, hi, ax.height() or 200) for v in values]


def test_run_detail_cells_carry_units_and_bytes_are_binary(qtbot):
    from opscope.app.runs.views import RunDetailView

    view = RunDetailView()
    qtbot.addWidget(view)
    view.resize(900, 700)
    view.show()
    peak = Metric(name="peak_mem", unit="bytes", samples=[7.108e8, 7.108e8, 7.109e8])
    speed = Metric(name="decode", unit="tok/s", samples=[12.0, 12.0, 12.0])
    view.show_run(_stored(1, "a-run", [peak, speed]))
    assert view.metrics.item(0, 2).text() == "677.9 MiB"  # 7.108e8 / 2**20 = 677.87
    assert view.metrics.item(1, 2).text() == "12.00 tok/s"
    assert "…" in view.metrics.item(1, 3).text() and view.metrics.item(1, 3).text().endswith("tok/s")
    assert view.histogram.getPlotItem().getAxis("bottom").labelText == "peak_mem (MiB)"
    view.show_metric(1)
    ticks = _tick_values(view.histogram.getPlotItem(), "left")
    assert ticks and all(float(t).is_integer() for t in ticks)  # 3 samples: counts 0..3, never 1.5
    assert view.histogram.getPlotItem().getAxis("left").labelText == "repetitions"


def test_compare_without_telemetry_says_why(qtbot):
    from opscope.app.runs.views import CompareView
    from opscope.engine.store.compare import compare

    view = CompareView()
    qtbot.addWidget(view)
    runs = [
        _stored(
            i,
            f"run-{i}",
            [
                Metric(name="decode", unit="tok/s", samples=[10.0 + i, 11.0, 12.0]),
                Metric(name="peak_mem", unit="bytes", samples=[7.108e8] * 3),
            ],
        )
        for i in (1, 2)
    ]
    view.show_comparison(compare(runs), runs)
    assert view.telemetry.getPlotItem().titleLabel.text == "No telemetry to compare: none of these runs recorded any"
    rows = {view.table.item(r, 0).text(): r for r in range(view.table.rowCount())}
    decode, peak = next(r for k, r in rows.items() if "decode" in k), next(r for k, r in rows.items() if "peak" in k)
    assert view.table.item(decode, 1).text() == "tok/s" and view.table.item(decode, 2).text().startswith("11.00 ")
    assert view.table.item(peak, 2).text().startswith("677.9 MiB")  # not 7.108e+08


def _panel_with(qtbot, samples: dict[str, float]):
    from opscope.app.telemetry.model import TelemetryModel
    from opscope.app.telemetry.panel import TelemetryPanel

    model = TelemetryModel(None, interval_ms=100, history_s=60, sources=[])  # fed below, not started
    t = now_ns()
    for k in range(20):
        model.sampler.history.append(t - (20 - k) * 100_000_000, samples)
    model.sampler.units.update({"host.cpu_pct": "%", "engine.cpu_pct": "%", "engine.rss_bytes": "bytes"})
    panel = TelemetryPanel(model, refresh_ms=10_000)
    qtbot.addWidget(panel)
    panel.resize(540, 800)
    panel.show()
    panel.refresh(force=True)
    return panel


def test_host_and_engine_cpu_share_one_scale_and_the_readout_has_units(qtbot):
    cores = os.cpu_count()
    panel = _panel_with(qtbot, {"host.cpu_pct": 100.0, "engine.cpu_pct": 100.0 * cores, "engine.rss_bytes": 2.0**30})
    _x, engine = panel.curves["engine.cpu_pct"].getOriginalDataset()
    assert engine[-1] == pytest.approx(100.0)  # every core busy = 100 % of the machine, like the host line
    title = panel.plots["cpu"].titleLabel.text
    assert f"(% of all {cores} cores)" in title and "host CPU" in title and "engine process" in title
    assert panel.plots["cpu"].legend is None  # the key sits in the title row, never over the 100 % line
    assert panel.plots["cpu"].getAxis("left").labelText == f"% of all {cores} cores"
    text = panel.readout_at(float(_x[-1]))
    assert f"host CPU 100 % of all {cores} cores" in text and "engine RSS 1 GiB" in text
    panel.timer.stop()


def test_dark_theme_titles_use_the_theme_foreground(qtbot, qapp):
    import pyqtgraph as pg
    from opscope.app.ui.theme import ThemeManager
    from opscope.app.window.panels import _follow_theme

    theme = ThemeManager(qapp, "dark")
    plot = pg.PlotWidget(title="raw samples")
    qtbot.addWidget(plot)
    try:
        _follow_theme(theme, plot)
        background, foreground = theme.plot_colors()
        assert foreground.lower() in plot.getPlotItem().titleLabel.item.toHtml().lower()
        plot.setTitle("a title set later, when a run opens")
        assert foreground.lower() in plot.getPlotItem().titleLabel.item.toHtml().lower()
    finally:
        theme.set_mode("light")
        _follow_theme(theme, plot)


def test_long_params_never_push_the_numbers_out_of_view(qtbot):
    from opscope.app.runs.views import RunDetailView

    view = RunDetailView()
    qtbot.addWidget(view)
    view.resize(820, 600)  # the Runs dock at 1400x900
    view.show()
    params = {f"setting_{i}": "a fairly long value " * 2 for i in range(6)}
    view.show_run(_stored(1, "a-run", [Metric(name="decode", unit="tok/s", samples=[1.0, 2.0, 3.0], params=params)]))
    table = view.metrics
    qtbot.waitExposed(table)
    median_right = table.columnViewportPosition(2) + table.columnWidth(2)
    assert table.columnWidth(1) <= 240 and median_right <= table.viewport().width()
    assert table.item(0, 1).toolTip().startswith("setting_0=")  # the full params on hover


def test_compare_keys_sit_in_the_title_not_over_the_bars(qtbot):
    from opscope.app.runs.views import CompareView
    from opscope.engine.store.compare import compare

    view = CompareView()
    qtbot.addWidget(view)
    runs = [
        _stored(i, f"run-{i}", [Metric(name="decode", unit="tok/s", samples=[10.0 + i, 11.0, 12.0])]) for i in (1, 2)
    ]
    view.show_comparison(compare(runs), runs)
    item = view.distributions.getPlotItem()
    assert item.legend is None and "run-1" in item.titleLabel.text and "run-2" in item.titleLabel.text
    ticks = _tick_values(item, "left")
    assert ticks and all(float(t).is_integer() for t in ticks)
