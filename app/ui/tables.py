"""Tables that stay readable in a 1400x900 window: columns fit their contents up to a cap, and a
capped cell shows its full text as a tooltip (a long params column must not push the numbers out).
``keep_in_view`` goes further: the columns always fit the view's width (no sideways scrolling), the
text columns named "elastic" giving up width, elided, with their full text on hover."""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import QEvent, QObject
from PySide6.QtWidgets import QHeaderView, QTableView, QTableWidget

MAX_COLUMN_PX = 240
MIN_ELASTIC_PX = 64  # an elastic column keeps room for a few characters and the "…"


def fit_columns(table: QTableWidget, max_px: int = MAX_COLUMN_PX) -> None:
    header = table.horizontalHeader()
    header.setSectionResizeMode(QHeaderView.Interactive)  # the user may still widen a capped column
    table.resizeColumnsToContents()
    for col in range(table.columnCount()):
        if table.columnWidth(col) <= max_px:
            continue
        table.setColumnWidth(col, max_px)
        _tooltips(table, col)
    refit(table)


def keep_in_view(table: QTableView, elastic: Sequence[int], max_px: int = MAX_COLUMN_PX) -> None:
    """Fit ``table``'s columns to its width now and whenever it is resized: each column gets its
    contents' width (at most ``max_px``); when they do not fit, the ``elastic`` columns (names,
    params, sources) narrow in proportion to their width, not below MIN_ELASTIC_PX."""
    table.setProperty("elasticColumns", list(elastic))
    table.setProperty("maxColumnPx", max_px)
    table.horizontalHeader().setStretchLastSection(False)
    table.horizontalHeader().setResizeContentsPrecision(0)  # measure the rows on screen, not 1000 of 100k
    table.setWordWrap(False)  # an elided cell stays one line: "dtype=float32, n=…", not two cut lines
    if getattr(table, "_refit_filter", None) is None:
        table._refit_filter = _RefitOnResize(table)
        table.viewport().installEventFilter(table._refit_filter)
    refit(table)


def refit(table: QTableView) -> None:
    """Fit the columns of a ``keep_in_view`` table again (new contents, a column shown)."""
    elastic = table.property("elasticColumns")
    if not elastic:
        return
    table.resizeColumnsToContents()  # the rows on screen only (precision 0): cheap for 100k ops
    cols = [c for c in range(table.model().columnCount()) if not table.isColumnHidden(c)]
    cap = table.property("maxColumnPx") or MAX_COLUMN_PX
    widths = {c: min(table.columnWidth(c), cap) for c in cols}
    excess = sum(widths.values()) - table.viewport().width()
    shrinkable = {c: widths[c] - MIN_ELASTIC_PX for c in elastic if c in widths and widths[c] > MIN_ELASTIC_PX}
    total = sum(shrinkable.values())
    for c, spare in shrinkable.items():
        if excess > 0:
            widths[c] -= min(spare, -(-excess * spare // total))  # ceil: the sum lands inside the view
    for c, width in widths.items():
        table.setColumnWidth(c, width)
        if isinstance(table, QTableWidget):
            _tooltips(table, c)


def _tooltips(table: QTableWidget, col: int) -> None:
    """The whole text on hover for every cell of ``col`` that does not fit it."""
    metrics, room = table.fontMetrics(), table.columnWidth(col) - 12  # the cell's own padding
    for row in range(table.rowCount()):
        item = table.item(row, col)
        if item is not None and not item.toolTip() and metrics.horizontalAdvance(item.text()) > room:
            item.setToolTip(item.text())


class _RefitOnResize(QObject):
    def __init__(self, table: QTableView) -> None:
        super().__init__(table)
        self.table = table

    def eventFilter(self, _obj, event) -> bool:
        if event.type() == QEvent.Resize and event.size().width() != event.oldSize().width():
            refit(self.table)
        return False


DISPLAY_UNITS = {"us": "µs"}  # stored units spelled for ASCII; shown as people write them


def display_unit(unit: str) -> str:
    return DISPLAY_UNITS.get(unit, unit)


def with_unit(v: float | None, unit: str) -> str:
    """A value as people read it, with its unit: bytes in binary units (engine.units), never 7.108e+08."""
    from opscope.engine import BYTE_UNITS, fmt_unit_value

    if v is None:
        return "–"
    if unit == "us" and abs(v) >= 1000:  # "1.123 ms", not "1,123 us"
        v, unit = v / 1000, "ms"
    unit = display_unit(unit)
    text = fmt_unit_value(v, unit)
    return text if unit in BYTE_UNITS or not unit else f"{text} {unit}"
