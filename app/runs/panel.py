"""The Runs panel: list, search, filter and sort saved runs; open one; compare several; rename,
tag, delete (after a confirmation) and export."""

from __future__ import annotations

from opscope.app.runs.model import RunRow, RunsModel
from opscope.app.runs.roofline import RooflineView
from opscope.app.runs.views import CompareView, RunDetailView
from opscope.app.ui.notify import export_guard
from opscope.app.ui.tables import keep_in_view, refit
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPushButton,
    QSizePolicy,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

COLUMNS = ("id", "name", "suite", "status", "quality", "tags", "model", "device", "created", "duration", "metrics")
RUN_COLUMN_MAX_PX = 170  # a capped cell shows its whole text as a tooltip (app/ui/tables.py)


class _SortItem(QTableWidgetItem):
    """Sorts by a key (numbers as numbers) while showing text."""

    def __init__(self, text: str, key) -> None:
        super().__init__(text)
        self.key = key

    def __lt__(self, other) -> bool:
        return self.key < other.key if isinstance(other, _SortItem) else super().__lt__(other)


def _quality_cell(quality: str | None) -> tuple[str, int]:
    """Text and sort key (best first) of a run's quality (engine.bench.quality); "–" when unknown."""
    from opscope.engine import QUALITIES

    return (quality or "–", QUALITIES.index(quality) if quality in QUALITIES else len(QUALITIES))


class RunsPanel(QWidget):
    storeChanged = Signal(str)  # the URL of the store now shown (benchmarks save there too)

    def __init__(self, model: RunsModel, notifier=None, parent: QWidget | None = None, client=None) -> None:
        super().__init__(parent)
        # client: the engine (app.engine_client.EngineClient) that computes rooflines off the GUI
        # thread; without one (a panel on its own) they are computed here.
        self.model, self.notifier, self.client = model, notifier, client
        self.rows: list[RunRow] = []
        self.search = QLineEdit(placeholderText="search names…")
        self.filters = {key: QComboBox() for key in ("kind", "tag", "model", "device")}
        self.table = QTableWidget(0, len(COLUMNS), sortingEnabled=True)
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.ExtendedSelection)
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        # The columns fit the dock's width: name, tags and model narrow (elided, whole on hover) and
        # every other column keeps its title and values (a 1280x800 window read "am" for "name").
        elastic = [COLUMNS.index(c) for c in ("name", "tags", "model")]
        keep_in_view(self.table, elastic=elastic, max_px=RUN_COLUMN_MAX_PX)
        self.detail, self.compare_view = RunDetailView(), CompareView()
        self.roofline_view = RooflineView()
        self.tabs = QTabWidget()
        self.tabs.addTab(self.detail, "Run")
        self.tabs.addTab(self.compare_view, "Compare")
        self.tabs.addTab(self.roofline_view, "Roofline")
        self.count = QLabel(objectName="statsLine")
        self.count.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        self.store_label = QLabel(objectName="statsLine", textInteractionFlags=Qt.TextSelectableByMouse)
        self.store_label.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        self.empty_hint = QLabel(objectName="panelHint", wordWrap=True, visible=False)
        self._build()
        self.search.textChanged.connect(lambda _t: self.refresh())
        for combo in self.filters.values():
            combo.currentIndexChanged.connect(lambda _i: self.refresh())
        self.table.doubleClicked.connect(lambda _index: self.open_selected())
        model.changed.connect(self.refresh)

    def _build(self) -> None:
        top = QHBoxLayout()
        top.addWidget(self.search, 2)
        for key, combo in self.filters.items():
            combo.setToolTip(f"filter by {key}")
            top.addWidget(combo, 1)
        top.addWidget(QPushButton("Refresh", clicked=self.refresh))
        store_row = QHBoxLayout()
        store_row.addWidget(QLabel("Store:"))
        store_row.addWidget(self.store_label, 1)
        store_row.addWidget(
            QPushButton(
                "Open store…",
                clicked=self.open_store_dialog,
                toolTip="Show the runs of another SQLite file or a PostgreSQL URL",
            )
        )
        store_row.addWidget(
            QPushButton(
                "Copy to store…",
                clicked=self.push_dialog,
                toolTip="Copy the selected runs to another store, e.g. the team's",
            )
        )
        actions = QHBoxLayout()
        for text, slot in (
            ("Open", self.open_selected),
            ("Compare", self.compare_selected),
            ("Roofline", self.roofline_selected),
            ("Rename…", self.rename_dialog),
            ("Tags…", self.tag_dialog),
            ("Delete…", self.delete_selected),
            ("Export…", self.export_dialog),
        ):
            actions.addWidget(QPushButton(text, clicked=slot))
        actions.addStretch(1)
        actions.addWidget(self.count)
        upper = QWidget()
        col = QVBoxLayout(upper)
        col.setContentsMargins(0, 0, 0, 0)
        col.addLayout(store_row)
        col.addLayout(top)
        col.addWidget(self.empty_hint)
        col.addWidget(self.table, 1)
        col.addLayout(actions)
        split = QSplitter(Qt.Vertical)
        split.addWidget(upper)
        split.addWidget(self.tabs)
        split.setStretchFactor(1, 2)
        split.setSizes([230, 570])  # at 1280x800 a compare needs the height: its rows and a readable plot
        QVBoxLayout(self).addWidget(split)

    # -- listing --------------------------------------------------------------------------------
    def refresh(self) -> None:
        try:
            f = {key: combo.currentData() or "" for key, combo in self.filters.items()}
            self.rows = self.model.rows(text=self.search.text().strip(), **f)
            everything = self.model.rows() if any(f.values()) or self.search.text() else self.rows
        except Exception as e:  # a broken store must not break the panel: say what failed
            self._error(f"Could not read the run store {self.model.db_url or '(default)'}: {e}")
            return
        self._fill_filters(everything)
        self._fill_table()
        self.store_label.setText(self.model.display_url)
        self.store_label.setToolTip(self.model.display_url)

    def _fill_table(self) -> None:
        self.table.setSortingEnabled(False)
        self.table.setRowCount(len(self.rows))
        for r, row in enumerate(self.rows):
            info = row.info
            duration = info.duration_s
            cells = (
                (str(info.id), info.id),
                (info.name, info.name),
                (info.kind, info.kind),
                (info.status, info.status),
                _quality_cell(info.quality),
                (", ".join(info.tags), ", ".join(info.tags)),
                (row.model, row.model),
                (row.device, row.device),
                (f"{info.created_at:%m-%d %H:%M}", info.created_at.timestamp()),  # the year: tooltip
                (f"{duration:.1f} s" if duration is not None else "–", duration or 0.0),
                (str(info.metric_count), info.metric_count),
            )
            for c, (text, key) in enumerate(cells):
                item = _SortItem(text, key)
                item.setData(Qt.UserRole, info.id)
                if COLUMNS[c] == "name":
                    item.setToolTip(text)  # whole, when the column elides it
                elif COLUMNS[c] == "created":
                    item.setToolTip(f"{info.created_at:%Y-%m-%d %H:%M:%S}")
                self.table.setItem(r, c, item)
        self.table.setSortingEnabled(True)
        refit(self.table)
        self.count.setText(f"{len(self.rows)} run(s)")
        filtered = bool(self.search.text().strip()) or any(c.currentData() for c in self.filters.values())
        self.empty_hint.setText(
            "No run matches the search and filters: clear them to see every run."
            if filtered
            else "No runs in this store yet: run a benchmark in the Benchmarks panel, or open "
            "another store (Open store…)."
        )
        self.empty_hint.setVisible(not self.rows)

    def _fill_filters(self, rows: list[RunRow]) -> None:
        values = {
            "kind": {r.info.kind for r in rows},
            "tag": {t for r in rows for t in r.info.tags},
            "model": {r.model for r in rows},
            "device": {r.device for r in rows},
        }
        for key, combo in self.filters.items():
            current = combo.currentData() or ""
            combo.blockSignals(True)
            combo.clear()
            combo.addItem(f"any {key}", "")
            for v in sorted(values[key] | ({current} if current else set())):
                combo.addItem(v, v)
            combo.setCurrentIndex(max(combo.findData(current), 0))
            combo.blockSignals(False)

    def selected_ids(self) -> list[int]:
        """Selected run ids, oldest first (the oldest is the baseline of a comparison)."""
        rows = {index.row() for index in self.table.selectionModel().selectedRows()}
        return sorted(self.table.item(r, 0).data(Qt.UserRole) for r in rows)

    def select_ids(self, run_ids: list[int]) -> None:
        self.table.clearSelection()
        mode = self.table.selectionMode()
        self.table.setSelectionMode(QAbstractItemView.MultiSelection)
        for r in range(self.table.rowCount()):
            if self.table.item(r, 0).data(Qt.UserRole) in run_ids:
                self.table.selectRow(r)
        self.table.setSelectionMode(mode)

    # -- store --------------------------------------------------------------------------------
    def open_store(self, location: str) -> bool:
        """Show the runs of the store at ``location``; on failure the current store stays and the
        reason goes to the notification area."""
        from opscope.app.runs.store_dialog import remember_store

        if not location:
            return False
        try:
            shown = self.model.switch_store(location)
        except Exception as e:  # any failure to open is the user's to see, never fatal
            self._error(
                f"Could not open the run store {location} — {type(e).__name__}: {e}. "
                f"Still showing {self.model.display_url}."
            )
            return False
        remember_store(location)
        self.storeChanged.emit(self.model.db_url)
        self.count.setText(f"Opened {shown}")
        return True

    def push_selected(self, location: str):
        """Copy the selected runs to the store at ``location``; returns the PushReport or None."""
        from opscope.app.runs.store_dialog import remember_store

        ids = self.selected_ids()
        if not ids:
            self._error("Select the runs to copy first (Ctrl+click for several).")
            return None
        try:
            report = self.model.push(ids, location)
        except Exception as e:
            self._error(f"Could not copy {len(ids)} run(s) to {location} — {type(e).__name__}: {e}")
            return None
        remember_store(location)
        self.count.setText(report.summary())
        if self.notifier is not None:
            self.notifier.info(report.summary(), "\n".join(report.lines()))
        return report

    def open_store_dialog(self) -> None:
        from opscope.app.runs.store_dialog import StoreDialog

        dialog = StoreDialog("Open a run store", "Open", "", self)
        if dialog.exec():
            self.open_store(dialog.location())

    def push_dialog(self) -> None:
        from opscope.app.runs.store_dialog import StoreDialog

        if not self.selected_ids():
            self._error("Select the runs to copy first (Ctrl+click for several).")
            return
        dialog = StoreDialog(f"Copy {len(self.selected_ids())} run(s) to a store", "Copy", "", self)
        if dialog.exec():
            self.push_selected(dialog.location())

    # -- actions --------------------------------------------------------------------------------
    def open_selected(self) -> None:
        ids = self.selected_ids()
        if ids:
            self.detail.show_run(self.model.load(ids[0]))
            self.tabs.setCurrentWidget(self.detail)

    def roofline_selected(self) -> None:
        ids = self.selected_ids()
        if not ids:
            self._error("Select an llm, matmul or attention run to see its roofline.")
            return
        if self.client is not None:  # the store read and torch's import: in the engine worker
            self.roofline_view.compute(self.client, self.model.db_url, ids[0])
        else:
            self.roofline_view.show_run(self.model.load(ids[0]), self.model.store)
        self.tabs.setCurrentWidget(self.roofline_view)

    def compare_selected(self) -> None:
        ids = self.selected_ids()
        if len(ids) < 2:
            self._error("Select two or more runs to compare (Ctrl+click); the oldest one is the baseline.")
            return
        runs = [self.model.load(i) for i in ids]
        from opscope.engine import compare

        self.compare_view.show_comparison(compare(runs), runs)
        self.tabs.setCurrentWidget(self.compare_view)

    def rename_dialog(self) -> None:
        ids = self.selected_ids()
        if len(ids) == 1:
            old = self.model.store.info(ids[0]).name
            name, ok = QInputDialog.getText(self, "Rename run", "New name:", text=old)
            if ok and name and name != old:
                self._guard(lambda: self.model.rename(ids[0], name))

    def tag_dialog(self) -> None:
        ids = self.selected_ids()
        if len(ids) == 1:
            tags = ", ".join(self.model.store.info(ids[0]).tags)
            text, ok = QInputDialog.getText(self, "Tags", "Tags (comma-separated):", text=tags)
            if ok:
                self._guard(lambda: self.model.set_tags(ids[0], [t.strip() for t in text.split(",") if t.strip()]))

    def delete_selected(self, confirm: bool = True) -> bool:
        ids = self.selected_ids()
        if not ids:
            return False
        names = ", ".join(self.model.store.info(i).name for i in ids)
        if (
            confirm
            and QMessageBox.question(
                self,
                "Delete runs",
                f"Delete {len(ids)} run(s) for good?\n{names}",
                QMessageBox.Yes | QMessageBox.No,
                QMessageBox.No,
            )
            != QMessageBox.Yes
        ):
            return False
        self._guard(lambda: self.model.delete(ids))
        return True

    def export_dialog(self) -> None:
        ids = self.selected_ids()
        if len(ids) == 1:
            path, _ = QFileDialog.getSaveFileName(
                self, "Export run", f"run-{ids[0]}.json", "JSON (*.json);;CSV (*.csv)"
            )
            if path:
                with export_guard(self, f"export run {ids[0]}", path):
                    self.model.export(ids[0], path)

    def _guard(self, action) -> None:
        from opscope.engine import EngineError

        try:
            action()
        except EngineError as e:
            self._error(str(e))

    def _error(self, message: str) -> None:
        if self.notifier is not None:
            self.notifier.error(message)
        self.count.setText(message)

    def shutdown(self) -> None:
        self.model.close()
