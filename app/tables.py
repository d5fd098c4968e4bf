"""Tables that stay readable in a 1400x900 window: columns fit their contents up to a cap, and a
capped cell shows its full text as a tooltip (a long params column must not push the numbers out)."""
from __future__ import annotations

from PySide6.QtWidgets import QHeaderView, QTableWidget

MAX_COLUMN_PX = 240


def fit_columns(table: QTableWidget, max_px: int = MAX_COLUMN_PX) -> None:
    header = table.horizontalHeader()
    header.setSectionResizeMode(QHeaderView.Interactive)  # the user may still widen a capped column
    table.resizeColumnsToContents()
    for col in range(table.columnCount()):
        if table.columnWidth(col) <= max_px:
            continue
        table.setColumnWidth(col, max_px)
        for row in range(table.rowCount()):
            item = table.item(row, col)
            if item is not None and not item.toolTip():
                item.setToolTip(item.text())


def with_unit(v: float | None, unit: str) -> str:
    """A value as people read it, with its unit: bytes in binary units (engine.units), never 7.108e+08."""
    from opscope.engine.store.render import fmt_unit_value
    from opscope.engine.units import BYTE_UNITS

    if v is None:
        return "–"
    text = fmt_unit_value(v, unit)
    return text if unit in BYTE_UNITS or not unit else f"{text} {unit}"
