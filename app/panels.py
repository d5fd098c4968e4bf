"""The panels that depend on optional engine parts (telemetry, trace, bench, store).

Each is built on its own: a panel whose engine part is missing or broken is replaced by a short
explanation instead of taking the window down with it.
"""
from __future__ import annotations

import logging

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

log = logging.getLogger(__name__)


def unavailable_panel(what: str, error: BaseException) -> QWidget:
    widget = QWidget()
    label = QLabel(f"{what} is not available: {type(error).__name__}: {error}", objectName="panelHint",
                   wordWrap=True, alignment=Qt.AlignCenter)
    QVBoxLayout(widget).addWidget(label)
    return widget


def build_optional_panels(window) -> dict[str, QWidget]:
    panels: dict[str, QWidget] = {}
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
        panels[name] = widget
        window.add_panel(name, title, widget, area, tab)
    window.docks["chat"].raise_()
    return panels


def _telemetry(window) -> QWidget:
    raise NotImplementedError("coming")


def _trace(window) -> QWidget:
    raise NotImplementedError("coming")


def _bench(window) -> QWidget:
    raise NotImplementedError("coming")


def _runs(window) -> QWidget:
    raise NotImplementedError("coming")
