"""The Benchmarks panel: pick a suite and its parameters, run it with progress, ETA and cancel, and
watch each point land on a live chart; the run is saved with its name and tags as it goes."""

from __future__ import annotations

import json

import numpy as np
import pyqtgraph as pg
from opscope.app.bench.model import BenchModel, point_summary
from opscope.app.bench.param_units import format_size, parse_size
from opscope.app.runs.roofline import RooflineView
from opscope.app.ui.tables import display_unit, fit_columns, keep_in_view, with_unit
from opscope.app.ui.widgets import category_ticks
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QSpinBox,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

ROW_COLUMNS = ("point", "params", "median", "min … max", "unit", "n", "status")


class ParamForm(QGroupBox):
    """Editors for a suite's parameters, built from the worker's suite catalog."""

    changed = Signal()  # any editor's value

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Parameters", parent)
        self.form = QFormLayout(self)
        self.fields: list[dict] = []
        self.editors: dict[str, QWidget] = {}
        self.units: dict[str, str] = {}

    def set_fields(self, fields: list[dict], quick: bool) -> None:
        while self.form.rowCount():
            self.form.removeRow(0)
        self.fields, self.editors, self.units = fields, {}, {}
        for f in fields:
            self.units[f["name"]] = f["unit"]
            editor = _editor(f, f["quick"] if quick else f["default"], f["unit"])
            self.editors[f["name"]] = editor
            _on_change(editor, lambda *_value: self.changed.emit())
            # "Call budget (s)": the unit once, in the label; the tooltip says what it changes and
            # the command line's name, so a value seen here can be given to `opscope bench --param`.
            tip = f"{f['help']}\n(--param {f['name']}=…)"
            label = QLabel(f["label"], toolTip=tip)
            label.setBuddy(editor)
            _set_tooltip(editor, tip)
            self.form.addRow(label, editor)

    def values(self) -> dict:
        return {f["name"]: _value(f, self.editors[f["name"]], self.units.get(f["name"], "")) for f in self.fields}


def _on_change(editor: QWidget, slot) -> None:
    if isinstance(editor, QCheckBox):
        editor.toggled.connect(slot)
    elif isinstance(editor, QLineEdit):
        editor.textChanged.connect(slot)
    else:
        editor.valueChanged.connect(slot)


def estimate_line(suite: str, est) -> str:
    """What Run will take, and on what it is based: "about 2 min (the last llm run here took …)"."""
    from opscope.engine import duration_text, took_text

    basis = (
        f"a guess: no earlier {suite} run on this machine"
        if est.guess
        else f"the last {suite} run here took {took_text(est.last_s)} for {_points(est.last_points)}"
    )
    budget = "the quick time budget; " if est.capped else ""
    return f"{duration_text(est.seconds)} for {_points(est.points)} ({budget}{basis})"


def _points(n: int) -> str:
    return f"{n} point" if n == 1 else f"{n} points"


def _set_tooltip(editor: QWidget, tip: str) -> None:
    """A list field's tooltip also holds its whole value (the field may show only its start)."""
    if not isinstance(editor, QLineEdit):
        editor.setToolTip(tip)
        return
    editor.textChanged.connect(lambda text: editor.setToolTip(f"{tip}\n\nnow: {text}"))
    editor.setToolTip(f"{tip}\n\nnow: {editor.text()}")


def _editor(field: dict, value, unit: str = "") -> QWidget:
    kind = field["kind"]
    if kind == "bool":
        return QCheckBox(checked=bool(value))
    if kind == "int":
        return QSpinBox(minimum=0, maximum=2**31 - 1, value=int(value))
    if kind == "float":
        return QDoubleSpinBox(minimum=0.0, maximum=1e9, decimals=3, value=float(value))
    show = format_size if unit == "bytes" else str  # "64 MiB", never "67108864"
    text = (
        ", ".join(show(v) for v in value)
        if kind in ("tuple_int", "tuple_str")
        else value
        if isinstance(value, str)
        else json.dumps(value)
    )
    edit = QLineEdit(text)
    edit.setCursorPosition(0)  # a list longer than the field shows its start, not "t32, bfloat16"
    return edit


def _value(field: dict, editor: QWidget, unit: str = ""):
    kind = field["kind"]
    if kind == "bool":
        return editor.isChecked()
    if kind in ("int", "float"):
        return editor.value()
    text = editor.text().strip()
    if kind == "tuple_int" and unit == "bytes":
        return [parse_size(v) for v in text.split(",") if v.strip()]
    if kind == "tuple_int":
        return [int(v) for v in text.replace(",", " ").split()]
    if kind == "tuple_str":
        return [v.strip() for v in text.split(",") if v.strip()]
    if kind == "str":
        return text
    return json.loads(text) if text else None


NO_POINTS_YET = "No results yet: press Run"  # short: a title never wraps, and the chart is narrow at 1024 px


def shown_unit(median_text: str, unit: str) -> str:
    """The unit column says the unit the values are shown in: "GiB" beside "3.20 GiB", not the
    stored "bytes" (byte values are shown in binary units, engine.units)."""
    from opscope.engine import BYTE_UNITS

    if unit in BYTE_UNITS and " " in median_text:
        return median_text.rsplit(" ", 1)[1]
    return display_unit(unit)


def _value_range(lo: float | None, hi: float | None, unit: str) -> str:
    """ "0.05 … 0.16 GFLOP/s": the unit once, so the cell fits its column (byte sizes keep both units)."""
    lo_text, hi_text = with_unit(lo, unit), with_unit(hi, unit)
    if unit and lo_text.endswith(f" {unit}"):
        lo_text = lo_text[: -len(unit) - 1]
    return f"{lo_text} … {hi_text}"


class BenchPanel(QWidget):
    def __init__(self, model: BenchModel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.model = model
        self.suites: dict[str, dict] = {}
        self.suite_combo = QComboBox()
        self.description = QLabel(objectName="panelHint", wordWrap=True)
        self.quick = QCheckBox(
            "Quick (tiny sizes)",
            checked=True,
            toolTip="Fewer, smaller points: a smaller budget, not a time promise (the llm "
            "suite took 121 s on a loaded host)",
        )
        self.params = ParamForm()
        self.name_edit = QLineEdit(placeholderText="automatic: <suite>-<date>")
        self.tags_edit = QLineEdit(placeholderText="e.g. baseline, laptop")
        # A/B: the same suite again with some flags changed, both interleaved in one process
        self.ab_check = QCheckBox("A/B: also run with these flags (B), interleaved with A")
        self.ab_flags = QLineEdit(
            placeholderText="e.g. --fastpath off, --threads 1, --param sizes=64; empty: A/A", enabled=False
        )
        self.ab_check.toggled.connect(self.ab_flags.setEnabled)
        self.ab_view = QPlainTextEdit(readOnly=True, objectName="abComparison")
        self.ab_view.setFont(QFontDatabase.systemFont(QFontDatabase.FixedFont))  # the table's columns align
        self.ab_view.setLineWrapMode(QPlainTextEdit.NoWrap)
        self._ab_shown = False  # the finished run was an A/B pair: its comparison tab stays in front
        self.ab_view.setPlainText(
            "Tick A/B and press Run: B is compared against A here, as `opscope runs compare` prints it."
        )
        self.run_button = QPushButton("Run", objectName="primary", clicked=self.run)
        self.cancel_button = QPushButton("Cancel", objectName="danger", clicked=model.cancel, enabled=False)
        self.estimate = QLabel(objectName="panelHint", wordWrap=True)  # how long Run will take
        self.estimate.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        self.progress = QProgressBar(textVisible=True, value=0)
        self.status = QLabel(
            "Choose a suite and press Run. Every point is saved as it completes.", objectName="statsLine", wordWrap=True
        )
        self.status.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        self.description.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)
        self.chart = pg.PlotWidget()
        self.roofline_view = RooflineView()  # the finished run's points against the ceilings
        self.tabs = QTabWidget()
        self.table = QTableWidget(0, len(ROW_COLUMNS))
        self.table.setHorizontalHeaderLabels(ROW_COLUMNS)
        self.table.verticalHeader().setVisible(False)
        keep_in_view(self.table, elastic=(0, 1, ROW_COLUMNS.index("status")))  # names elide, numbers never
        self._running = ""  # the suite being run
        self._chart_unit: str | None = None
        self._chart_names: list[str] = []
        self._chart_rows: list[int] = []
        self._build()
        self._connect()

    def _connect(self) -> None:
        model = self.model
        self.suite_combo.currentIndexChanged.connect(lambda _i: self._show_suite())
        self.quick.toggled.connect(lambda _q: self._show_suite())
        self.params.changed.connect(self._show_estimate)
        model.started.connect(self._on_started)
        model.progress.connect(self._on_progress)
        model.point.connect(self._on_point)
        model.finished.connect(self._on_finished)
        model.failed.connect(self._on_failed)
        model.runSaved.connect(self.show_roofline)
        model.finished.connect(lambda _r: self._show_estimate())  # this run is the history now
        self.roofline_view.computed.connect(self._on_roofline)

    def _build(self) -> None:
        left = QWidget()
        form = QFormLayout(left)
        form.addRow("Suite", self.suite_combo)
        form.addRow(self.description)
        form.addRow(self.quick)
        form.addRow(self.params)
        form.addRow("Name", self.name_edit)
        form.addRow("Tags", self.tags_edit)
        form.addRow(self.ab_check)
        form.addRow("B flags", self.ab_flags)
        self.tabs.addTab(self.chart, "Points")
        self.tabs.addTab(self.roofline_view, "Roofline")
        self.tabs.addTab(self.ab_view, "A/B")
        self.roofline_view.summary.setText(
            "After an llm, matmul or attention run its points show here against the compute and bandwidth ceilings."
        )
        # The form scrolls: a suite with ten parameters must not make the window taller than a
        # 1024x640 screen.
        self.form_scroll = QScrollArea(widgetResizable=True, frameShape=QFrame.NoFrame)
        self.form_scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.form_scroll.setWidget(left)
        # Run and Cancel stay in sight under the scrolling form
        buttons = QHBoxLayout()
        buttons.addWidget(self.run_button)
        buttons.addWidget(self.cancel_button)
        buttons.addWidget(self.estimate, 1)
        side = QWidget()
        side_col = QVBoxLayout(side)
        side_col.setContentsMargins(0, 0, 0, 0)
        side_col.addWidget(self.form_scroll, 1)
        side_col.addLayout(buttons)
        top = QSplitter(Qt.Horizontal)
        top.addWidget(side)
        top.addWidget(self.tabs)
        top.setStretchFactor(1, 3)
        # The table spans the whole panel under the form and the chart: at 1400x900 its seven
        # columns then fit side by side, with no sideways scrolling.
        splitter = QSplitter(Qt.Vertical)
        splitter.addWidget(top)
        splitter.addWidget(self.table)
        splitter.setStretchFactor(0, 3)
        splitter.setStretchFactor(1, 2)
        splitter.setSizes([480, 240])  # the form and the plots on top; the rest for the table's rows
        self.table.verticalHeader().setDefaultSectionSize(self.fontMetrics().lineSpacing() + 8)
        layout = QVBoxLayout(self)
        layout.addWidget(splitter, 1)
        layout.addWidget(self.progress)
        layout.addWidget(self.status)
        self.chart.showGrid(x=True, y=True, alpha=0.2)
        self.chart.setLabel("bottom", "point (median, bar: interquartile range)")
        self.chart.getPlotItem().getAxis("bottom").enableAutoSIPrefix(False)
        self.chart.setTitle(NO_POINTS_YET)  # an empty 0..1 plot says why it is empty

    def set_suites(self, suites: list[dict]) -> None:
        self.suites = {s["name"]: s for s in suites}
        self.suite_combo.clear()
        self.suite_combo.addItems(list(self.suites))

    def _show_suite(self) -> None:
        suite = self.suites.get(self.suite_combo.currentText())
        if suite:
            self.description.setText(suite["description"])
            self.params.set_fields(suite["params"], self.quick.isChecked())
            self._fit_form_width()
            self._show_estimate()

    def _show_estimate(self) -> None:
        """ "about 2 min …" beside Run, for the form as it is now."""
        from opscope.engine import estimate_run

        suite = self.suites.get(self.suite_combo.currentText())
        try:
            params = self.params.values() if suite else None
        except (ValueError, json.JSONDecodeError):
            params = None  # Run will say which parameter is not valid
        if not suite or params is None:
            self.estimate.setText("")
            return
        name, quick = suite["name"], self.quick.isChecked()
        est = estimate_run(
            name, params, quick, needs_model=suite["needs_model"], last=self.model.last_run_here(name, quick)
        )
        self.estimate.setText(estimate_line(name, est))

    def _fit_form_width(self) -> None:
        """The scrolling form as wide as its widest row, so no label or field is cut."""
        form = self.form_scroll.widget()
        form.adjustSize()
        bar = self.form_scroll.verticalScrollBar().sizeHint().width()
        self.form_scroll.setMinimumWidth(form.minimumSizeHint().width() + bar)

    def run(self) -> None:
        tags = [t.strip() for t in self.tags_edit.text().split(",") if t.strip()]
        try:
            params = self.params.values()
        except (ValueError, json.JSONDecodeError) as e:
            self.status.setText(f"a parameter is not valid: {e}")
            return
        ab = self.ab_flags.text().strip() if self.ab_check.isChecked() else None
        self.model.run(
            self.suite_combo.currentText(),
            params,
            name=self.name_edit.text().strip(),
            tags=tags,
            quick=self.quick.isChecked(),
            ab=ab,
        )

    # -- progress -------------------------------------------------------------------------------
    def _on_started(self, suite: str) -> None:
        self.run_button.setEnabled(False)
        self.cancel_button.setEnabled(True)
        self.table.setRowCount(0)
        self.tabs.setCurrentWidget(self.chart)
        self._ab_shown = False
        self.chart.clear()
        self.chart.setTitle(f"{suite}: waiting for the first point…")
        self.chart.setLabel("left", "")  # the last run's unit (GFLOP/s) is not this one's
        self.chart.getAxis("bottom").setTicks(None)
        self._chart_unit, self._chart_names, self._chart_rows = None, [], []
        self.table.verticalHeader().setVisible(False)
        self.progress.setRange(0, 0)
        self.status.setText(f"running {suite}… (planning, warm-up)")
        self._running = suite

    def _on_progress(self, done: float, total: int, eta_s) -> None:
        self.progress.setRange(0, 1000)
        self.progress.setValue(int(1000 * done / max(total, 1)))
        # "about 0 s left" on a finished run says nothing; under 1 s the run is about to end
        eta = f", about {eta_s:.0f} s left" if eta_s is not None and done < total and eta_s >= 0.5 else ""
        done_text = f"{done:.0f}" if float(done).is_integer() else f"{done:.1f}"  # "1 / 1", never "1.0 / 1"
        self.progress.setFormat(f"{done_text} / {total} points{eta}")
        if done > 0:  # past planning and warm-up: say so, not "(planning, warm-up)" until the end
            self.status.setText(f"running {self._running}… measuring")

    def _on_point(self, point: dict) -> None:
        s = point_summary(point)
        row = self.table.rowCount()
        self.table.insertRow(row)
        params = ", ".join(f"{k}={v}" for k, v in point.get("params", {}).items())
        unit = point["unit"]
        side = f" [{point['ab'].upper()}]" if point.get("ab") else ""  # an A/B run: which side
        median = with_unit(s["median"], unit)
        cells = (
            point["name"] + side,
            params,
            median,
            _value_range(s["lo"], s["hi"], unit),
            shown_unit(median, unit),
            str(s["n"]),
            point["status"] if point["status"] == "ok" else f"{point['status']}: {point['error']}",
        )
        for col, text in enumerate(cells):
            self.table.setItem(row, col, QTableWidgetItem(text))
        fit_columns(self.table, max_px=170)  # the params column must leave room for the numbers
        self._chart_point(point, s)

    def _chart_point(self, point: dict, s: dict) -> None:
        """Plot the points that share the first unit seen (a chart has one y axis)."""
        if s["median"] is None or point["unit"] == "bytes":
            return
        if self._chart_unit is None:
            self._chart_unit = point["unit"]
            self.chart.setLabel("left", display_unit(point["unit"]))
        if point["unit"] != self._chart_unit:
            return
        self._chart_names.append(point["name"])
        self._chart_rows.append(self.table.rowCount())  # the table's 1-based row header of this point
        self.chart.setTitle(None)
        x = float(len(self._chart_names) - 1)
        self.chart.plot([x], [s["median"]], pen=None, symbol="o", symbolBrush="#3182ce", symbolSize=9)
        # The bar is the interquartile range: one outlier on a busy machine must not hide the spread.
        self.chart.addItem(
            pg.ErrorBarItem(
                x=np.array([x]),
                y=np.array([s["median"]]),
                top=np.array([s["q3"] - s["median"]]),
                bottom=np.array([s["median"] - s["q1"]]),
                beam=0.2,
            )
        )
        self._label_points()
        self.chart.setXRange(-0.5, x + 0.5, padding=0)

    def _label_points(self) -> None:
        """Point names under the chart, never overlapping: without their shared prefix, or the
        table's row numbers (its row header then shows) when even those do not fit."""
        axis = self.chart.getPlotItem().getAxis("bottom")
        metrics = self.chart.fontMetrics()
        labels, numbered = category_ticks(
            self._chart_names, max(axis.width(), self.chart.width() - 80), metrics.horizontalAdvance, self._chart_rows
        )
        axis.setTicks([list(enumerate(labels))])
        self.table.verticalHeader().setVisible(numbered)

    def _on_finished(self, result: dict) -> None:
        self._done()
        self.progress.setValue(1000)
        self.progress.setFormat(self.progress.format().split(",")[0] + ", done")  # "6 / 6 points, done"
        extra = f" ({result['error']})" if result.get("error") else ""
        if result.get("comparison") is not None:
            self._show_ab(result, extra)
            return
        self.status.setText(
            f"{result['status']}: saved as run “{result['name']}” (id {result['run_id']}) with "
            f"{result['metrics']} metrics{extra}. Open it in Runs."
        )

    def _show_ab(self, result: dict, extra: str) -> None:
        """B against A in the A/B tab, in `runs compare`'s words (interleaved, significance, quality)."""
        self.ab_view.setPlainText(result["comparison"])
        self._ab_shown = True
        self.tabs.setCurrentWidget(self.ab_view)
        a_id, b_id = result["run_ids"]
        self.status.setText(
            f"{result['status']}: A/B saved as runs “{result['name']}” (ids {a_id}, {b_id}), "
            f"measured interleaved in one process{extra}. B against A is in the A/B tab."
        )

    def _on_failed(self, message: str) -> None:
        self._done()
        self.status.setText(f"stopped: {message}")

    def _done(self) -> None:
        self.run_button.setEnabled(True)
        self.cancel_button.setEnabled(False)
        if not self._chart_names:
            self.chart.setTitle("No point to chart: see the table below")
        if self.progress.maximum() == 0:
            self.progress.setRange(0, 1000)

    def show_roofline(self, run_id: int):
        """Once a run is saved: the engine worker reads it and computes its roofline (never the GUI
        thread: that read and torch's import froze the window for seconds); an llm/matmul/attention
        run's is then drawn in its tab (_on_roofline). Returns the engine Job, None for no request."""
        from opscope.engine import ROOFLINE_SUITES as SUITES

        if self._running and self._running not in SUITES:  # nothing to place: leave the tab as it is
            return None
        return self.roofline_view.compute(self.model.client, self.model.db_url, run_id)

    def _on_roofline(self, shown: bool) -> None:
        if shown and not self._ab_shown:  # an A/B pair's comparison tab stays in front
            self.tabs.setCurrentWidget(self.roofline_view)
