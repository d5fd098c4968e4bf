"""The panels that depend on optional engine parts (telemetry, trace, bench, store).

Each is built on its own: a panel whose engine part is missing or broken is replaced by a short
explanation instead of taking the window down with it.
"""

from __future__ import annotations

import logging

from opscope.app.ui import settings
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

log = logging.getLogger(__name__)


def unavailable_panel(what: str, error: BaseException) -> QWidget:
    widget = QWidget()
    label = QLabel(
        f"{what} is not available: {type(error).__name__}: {error}",
        objectName="panelHint",
        wordWrap=True,
        alignment=Qt.AlignCenter,
    )
    QVBoxLayout(widget).addWidget(label)
    return widget


def build_optional_panels(window) -> None:
    """Build every optional panel into ``window.panels`` and dock it; later panels may use earlier ones."""
    specs = (
        ("telemetry", "Telemetry", _telemetry, Qt.RightDockWidgetArea, None),
        ("trace", "Trace", _trace, Qt.LeftDockWidgetArea, "chat"),
        ("bench", "Benchmarks", _bench, Qt.LeftDockWidgetArea, "chat"),
        ("runs", "Runs", _runs, Qt.LeftDockWidgetArea, "chat"),
    )
    for name, title, factory, area, tab in specs:
        try:
            widget = factory(window)
        except Exception as e:  # one broken panel must not stop the app from starting
            log.exception("%s panel failed to build", title)
            widget = unavailable_panel(title, e)
        window.panels[name] = widget
        window.add_panel(name, title, widget, area, tab)
    window.docks["chat"].raise_()


def _telemetry(window) -> QWidget:
    from opscope.app.telemetry.model import TelemetryModel
    from opscope.app.telemetry.panel import TelemetryPanel

    model = TelemetryModel(window.client, parent=window)
    model.start()
    panel = TelemetryPanel(model)
    _follow_theme(window.theme, panel)
    return panel


def _trace(window) -> QWidget:
    from opscope.app.trace.model import TraceModel
    from opscope.app.trace.panel import TracePanel

    panel = TracePanel(TraceModel(window.client, parent=window))
    _follow_theme(window.theme, panel.timeline)
    window.engineInfo.connect(lambda info: _set_variants(panel, info.get("trace_variants")))
    return panel


def _set_variants(panel, variants) -> None:
    if variants:
        current = panel.variant.currentText()
        panel.variant.clear()
        panel.variant.addItems(variants)
        panel.variant.setCurrentIndex(max(panel.variant.findText(current), 0))


def _bench(window) -> QWidget:
    from opscope.app.bench.model import BenchModel
    from opscope.app.bench.panel import BenchPanel

    model = BenchModel(window.client, window.db_url, parent=window)
    panel = BenchPanel(model)
    _follow_theme(window.theme, panel.chart)
    window.engineInfo.connect(lambda info: panel.set_suites(info.get("suites", [])))
    return panel


def _runs(window) -> QWidget:
    from opscope.app.runs.model import RunsModel
    from opscope.app.runs.panel import RunsPanel

    panel = RunsPanel(RunsModel(window.db_url, parent=window), window.notifier, client=window.client)
    for plot in (
        panel.detail.histogram,
        panel.detail.telemetry,
        panel.compare_view.distributions,
        panel.compare_view.telemetry,
    ):
        _follow_theme(window.theme, plot)
    bench = window.panels.get("bench")
    if hasattr(bench, "model"):
        bench.model.runSaved.connect(lambda _id: panel.refresh())
        panel.storeChanged.connect(lambda url: setattr(bench.model, "db_url", url))
    panel.storeChanged.connect(lambda url: setattr(window, "db_url", url))
    panel.storeChanged.connect(lambda url: settings.set_value("runs/store", url))  # the next start opens it
    panel.refresh()
    return panel


def _follow_theme(theme, target) -> None:
    """Keep a TelemetryPanel (apply_theme) or a pyqtgraph PlotWidget (setBackground) in the theme."""

    def apply(_name: str = "") -> None:
        background, foreground = theme.plot_colors()
        if hasattr(target, "apply_theme"):
            target.apply_theme(background, foreground)
            return
        import pyqtgraph as pg

        # Titles set later (a run opened, a metric picked) take pyqtgraph's default foreground:
        # make it the theme's, and re-render the title shown now.
        pg.setConfigOption("foreground", foreground)
        target.setBackground(background)
        item = target.getPlotItem()
        for side in ("left", "bottom"):
            axis = item.getAxis(side)
            axis.setPen(foreground)
            axis.setTextPen(foreground)
        item.titleLabel.setText(item.titleLabel.text, color=foreground)
        if item.legend is not None:
            item.legend.setLabelTextColor(foreground)
            for _sample, label in item.legend.items:
                label.setText(label.text)

    apply()
    theme.changed.connect(apply)
