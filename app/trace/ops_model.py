"""The trace's op table: a virtualized QAbstractTableModel over numpy columns.

Qt asks only for the rows on screen, so 100k+ ops cost nothing to show; filters are vectorized
numpy expressions that produce an index array, never a per-row Python loop over Qt calls.
"""

from __future__ import annotations

import fnmatch

import numpy as np
from opscope.app.ui.status import format_bytes
from opscope.app.ui.theme import device_color
from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, QSize, Qt
from PySide6.QtGui import QColor, QFontMetrics
from PySide6.QtWidgets import QApplication

# (column key, header, format)
COLUMNS = (
    ("seq", "#", "{}"),
    ("op", "op", "{}"),
    ("kind", "class", "{}"),
    ("direction", "dir", "{}"),
    ("device", "device", "{}"),
    ("module", "module", "{}"),
    ("source", "source line", "{}"),
    ("step", "step", "{}"),
    ("t_us", "t (µs)", "{:.0f}"),
    ("dur_us", "dur (µs)", "{:.1f}"),
    ("bytes", "bytes", "{:,}"),
    ("shapes", "input shapes", "{}"),
)
KIND_COLORS = {"fallback": "#e53e3e", "transfer": "#dd6b20", "sync": "#d69e2e", "mixed": "#805ad5"}
# Shown at 1400x900 without sideways scrolling; the others are a right-click on the header away,
# and every op's hover text holds all of them.
HIDDEN_BY_DEFAULT = ("source", "step", "t_us", "shapes")
ELASTIC = ("op", "module", "source", "shapes")  # text that may elide (whole on hover); numbers never
# Columns sized by every value, not only the rows on screen (none, for a trace that arrives while
# its dock is a hidden tab: names came out "pow.Tenso…" in a half-empty table); the elastic ones
# (op, module) still give up width when the view is too narrow for all.
WHOLE = ("seq", "kind", "direction", "device", "op", "module")


class OpTableModel(QAbstractTableModel):
    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.columns: dict[str, np.ndarray] = {key: np.empty(0, dtype=object) for key, _h, _f in COLUMNS}
        self.rows = np.empty(0, dtype=np.int64)  # indices of the rows that pass the filters
        self._pending: dict[str, list] = {key: [] for key, _h, _f in COLUMNS}

    # -- data in --------------------------------------------------------------------------------
    def add_batch(self, columns: dict[str, list]) -> None:
        """Collect a batch from the worker; ``commit`` makes the collected rows visible."""
        for key in self._pending:
            self._pending[key].extend(columns.get(key, ()))

    def commit(self) -> None:
        self.beginResetModel()
        self.columns = {key: _array(key, values) for key, values in self._pending.items()}
        self._pending = {key: [] for key in self._pending}
        self.rows = np.arange(self.total, dtype=np.int64)
        self.endResetModel()

    def clear(self) -> None:
        self._pending = {key: [] for key in self._pending}
        self.commit()

    @property
    def total(self) -> int:
        return len(self.columns["seq"])

    def distinct(self, key: str) -> list[str]:
        return sorted(set(self.columns[key].tolist())) if self.total else []

    # -- filtering ------------------------------------------------------------------------------
    def set_filter(
        self,
        device: str = "",
        kind: str = "",
        module: str = "",
        op: str = "",
        sources: tuple[str, ...] = (),
        modules: tuple[str, ...] = (),
    ) -> int:
        """Keep rows matching every filter given; ``module``/``op`` are substrings or globs;
        ``sources``/``modules`` (from a finding) match a source line or a module pattern off target."""
        mask = np.ones(self.total, dtype=bool)
        c = self.columns
        if device:
            mask &= c["device"] == device
        if kind:
            mask &= c["kind"] == kind
        if module:
            mask &= _text_match(c["module"], module)
        if op:
            mask &= _text_match(c["op"], op)
        if sources or modules:
            mask &= _finding_match(c, sources, modules)
        self.beginResetModel()
        self.rows = np.flatnonzero(mask)
        self.endResetModel()
        return len(self.rows)

    # -- Qt model -------------------------------------------------------------------------------
    def rowCount(self, parent=QModelIndex()) -> int:
        return 0 if parent.isValid() else len(self.rows)

    def columnCount(self, parent=QModelIndex()) -> int:
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(self, section: int, orientation, role=Qt.DisplayRole):
        if orientation != Qt.Horizontal:
            return None
        if role == Qt.DisplayRole:
            return COLUMNS[section][1]
        if role == Qt.SizeHintRole and COLUMNS[section][0] in WHOLE:
            return self._whole_width(COLUMNS[section][0])
        return None

    def _whole_width(self, key: str) -> QSize | None:
        """Room for the widest value of a short column (the table sizes its columns by the rows
        on screen only: "#" read "…" past row 99 and "dir" "…" for the first transfer)."""
        if not self.total:
            return None
        values = [str(int(self.columns[key].max()))] if key == "seq" else self.distinct(key)
        if key == "op":
            values = [v.removeprefix("aten.") for v in values]  # as the cells show them
        values.append(next(h for k, h, _f in COLUMNS if k == key) + "  ")  # the title, and its sort arrow's room
        metrics = QFontMetrics(QApplication.font())
        return QSize(max(metrics.horizontalAdvance(v) for v in values) + 16, metrics.height() + 6)

    def data(self, index: QModelIndex | QPersistentModelIndex, role=Qt.DisplayRole):
        if not index.isValid():
            return None
        row = self.rows[index.row()]
        key, _header, fmt = COLUMNS[index.column()]
        if role == Qt.DisplayRole:
            if key == "bytes":  # "2.3 MiB", not "2,359,296": the op name keeps the room
                return format_bytes(float(self.columns[key][row]))
            if key == "op":  # nearly every op is aten's: "mul.Tensor" says it in less room (whole on hover)
                return str(self.columns[key][row]).removeprefix("aten.")
            return fmt.format(self.columns[key][row])
        if role == Qt.ForegroundRole:
            if key == "device":
                return QColor(device_color(str(self.columns["device"][row])))
            if key == "kind":
                color = KIND_COLORS.get(str(self.columns["kind"][row]))
                return QColor(color) if color else None
        if role == Qt.ToolTipRole:
            return self.describe(row)
        if role == Qt.TextAlignmentRole and key in ("seq", "step", "t_us", "dur_us", "bytes"):
            return int(Qt.AlignRight | Qt.AlignVCenter)
        return None

    def describe(self, row: int) -> str:
        """Every field of the op at model row ``row``, one per line, with its unit (the hover text)."""
        return "\n".join(
            f"{header}: {fmt.format(self.columns[key][row])}" + (" B" if key == "bytes" else "")
            for key, header, fmt in COLUMNS
            if str(self.columns[key][row]) != ""
        )

    def row_dict(self, view_row: int) -> dict:
        row = self.rows[view_row]
        return {key: self.columns[key][row] for key, _h, _f in COLUMNS}


def _array(key: str, values: list) -> np.ndarray:
    if key in ("seq", "step", "bytes"):
        return np.asarray(values, dtype=np.int64)
    if key in ("t_us", "dur_us"):
        return np.asarray(values, dtype=np.float64)
    return np.asarray(values, dtype=str) if values else np.empty(0, dtype=str)


def _text_match(column: np.ndarray, pattern: str) -> np.ndarray:
    if any(ch in pattern for ch in "*?["):
        unique = np.unique(column)  # glob on the few distinct values, then map back
        keep = {u for u in unique.tolist() if fnmatch.fnmatchcase(u, pattern)}
        return np.isin(column, list(keep))
    return np.char.find(column, pattern) >= 0


def _finding_match(c: dict[str, np.ndarray], sources: tuple[str, ...], modules: tuple[str, ...]) -> np.ndarray:
    by_source = np.isin(c["source"], list(sources)) if sources else np.zeros(len(c["source"]), bool)
    off_target = c["kind"] != "on_target"
    by_module = np.zeros(len(c["module"]), bool)
    for pattern in modules:
        if pattern:
            by_module |= _text_match(c["module"], pattern)
    return by_source | (by_module & off_target)
