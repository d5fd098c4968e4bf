"""Light and dark themes that follow the system (QStyleHints.colorScheme), with a manual override.

Qt widgets get a Fusion palette plus the stylesheet from resources/; pyqtgraph plots get matching
background and foreground colours through ``plot_colors()`` and the ``changed`` signal.
"""

from __future__ import annotations

import logging

from opscope import resources
from opscope.app.ui import qt_compat  # noqa: F401  (must run before any emit)
from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QColor, QGuiApplication, QIcon, QPalette, QPixmap
from PySide6.QtWidgets import QApplication

log = logging.getLogger(__name__)

# Device colours used everywhere (trace table, timeline, summary cards): one meaning, one colour.
DEVICE_COLORS = {
    "cpu": "#3182ce",
    "cuda": "#38a169",
    "mps": "#805ad5",
    "meta": "#d69e2e",
    "transfer": "#e53e3e",
    "sync": "#dd6b20",
    "other": "#718096",
}
PHASE_COLORS = {
    "prefill": (246, 173, 85),
    "decode": (79, 209, 197),
    "bench_iter": (159, 122, 234),
    "model_load": (160, 174, 192),
}

_DARK = {
    QPalette.Window: "#232831",
    QPalette.WindowText: "#e2e8f0",
    QPalette.Base: "#1a1f27",
    QPalette.AlternateBase: "#262c36",
    QPalette.Text: "#e2e8f0",
    QPalette.Button: "#2d3440",
    QPalette.ButtonText: "#e2e8f0",
    QPalette.Highlight: "#3182ce",
    QPalette.HighlightedText: "#ffffff",
    QPalette.ToolTipBase: "#2d3440",
    QPalette.ToolTipText: "#e2e8f0",
    QPalette.PlaceholderText: "#718096",
    QPalette.Link: "#63b3ed",
    QPalette.Mid: "#4a5568",
}


def device_color(device: str) -> str:
    return DEVICE_COLORS.get(device.split(":")[0], DEVICE_COLORS["other"])


def app_icon() -> QIcon:
    icon = QIcon()
    for size in resources.ICON_SIZES:
        pixmap = QPixmap()
        pixmap.loadFromData(resources.icon_png(size), "PNG")
        icon.addPixmap(pixmap)
    return icon


def system_scheme() -> str:
    hints = QGuiApplication.styleHints()
    return "dark" if hints.colorScheme() == Qt.ColorScheme.Dark else "light"


class ThemeManager(QObject):
    """Applies a theme to the application; ``mode`` is "system", "light" or "dark"."""

    changed = Signal(str)  # the effective theme: "light" | "dark"

    def __init__(self, app: QApplication, mode: str = "system") -> None:
        super().__init__(app)
        self._app = app
        self.mode = mode
        self.current = ""
        app.setStyle("Fusion")  # the one style whose palette is honoured on every platform
        self._default_palette = QPalette(app.palette())
        QGuiApplication.styleHints().colorSchemeChanged.connect(lambda _scheme: self.apply())
        self.apply()

    def set_mode(self, mode: str) -> None:
        if mode not in ("system", "light", "dark"):
            raise ValueError(f"unknown theme mode {mode!r}")
        self.mode = mode
        self.apply()

    def apply(self) -> None:
        theme = system_scheme() if self.mode == "system" else self.mode
        self._app.setPalette(_palette(theme, self._default_palette))
        self._app.setStyleSheet(resources.stylesheet(theme))
        if theme != self.current:
            self.current = theme
            import pyqtgraph as pg  # plots created from now on start in the theme's colours

            background, foreground = self.plot_colors()
            pg.setConfigOptions(background=background, foreground=foreground, antialias=False)
            log.debug("theme: %s", theme)
            self.changed.emit(theme)

    def plot_colors(self) -> tuple[str, str]:
        """(background, foreground) for pyqtgraph in the current theme."""
        return ("#1a1f27", "#cbd5e0") if self.current == "dark" else ("#ffffff", "#2d3748")


def _palette(theme: str, default: QPalette) -> QPalette:
    if theme == "light":
        palette = QPalette(default)
        palette.setColor(QPalette.Highlight, QColor("#2b6cb0"))
        return palette
    palette = QPalette()
    for role, color in _DARK.items():
        palette.setColor(role, QColor(color))
    for role in (QPalette.Text, QPalette.ButtonText, QPalette.WindowText):
        palette.setColor(QPalette.Disabled, role, QColor("#718096"))
    return palette
