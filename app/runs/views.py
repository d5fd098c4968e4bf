"""One run in detail, and several runs compared: tables, raw-sample distributions, telemetry."""

from __future__ import annotations

import json

import numpy as np
import pyqtgraph as pg
from opscope.app.telemetry.plots import LINE_COLORS
from opscope.app.ui.tables import keep_in_view, with_unit
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QHeaderView,
    QLabel,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

TELEMETRY_PREFERENCE = ("gpu0.util_pct", "host.cpu_pct", "engine.cpu_pct", "engine.rss_bytes")
WORSE, BETTER = QColor("#e53e3e"), QColor("#38a169")
DISTURBED = QColor("#8a8f98")
DISTRIBUTION_MIN_PX = 120  # a few count ticks and the axis title; the window still fits 1024x640  # neither better nor worse: not to be read as a change


def compare_header(cmp) -> str:
    """Two short lines over the compare table: what Δ means and what each mark means (the engine's
    footnotes, whole, are the header's tooltip)."""
    from opscope.engine import DISTURBED_MARK, FEW_MARK, NOISY_MARK

    names = [r.name for r in cmp.runs]
    marks = [f"{FEW_MARK} few samples", f"{NOISY_MARK} noisy", f"{DISTURBED_MARK} disturbed (grey: not a result)"]
    warn = f" · {len(cmp.notes)} warning(s), on hover" if cmp.notes else ""
    return (
        f"Baseline <b>{names[0]}</b> vs {', '.join(names[1:])}. Δ: change of the median where significant "
        f"(Mann-Whitney p ≤ {cmp.alpha:g}), ~ none.<br>Marks: {', '.join(marks)}{warn}"
    )


def short_delta(delta, disturbed: bool) -> str:
    """A Δ cell in a few characters: "+30.1%", "~", "+2.0%?" (too few samples to decide); with
    "³" when either side was disturbed. p and n are the cell's tooltip."""
    from opscope.engine import DISTURBED_MARK

    if delta is None:
        return ""
    text = (
        "~"
        if delta.decidable and not delta.significant
        else f"{delta.delta_pct:+.1f}%" + ("" if delta.decidable else "?")
    )
    return text + (DISTURBED_MARK if disturbed else "")


def _table(headers: list[str]) -> QTableWidget:
    table = QTableWidget(0, len(headers))
    table.setHorizontalHeaderLabels(headers)
    table.verticalHeader().setVisible(False)
    table.setEditTriggers(QTableWidget.NoEditTriggers)
    table.setSelectionBehavior(QTableWidget.SelectRows)
    table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeToContents)
    return table


def _fill(table: QTableWidget, rows: list[list[str]]) -> None:
    from opscope.app.ui.tables import fit_columns

    table.setRowCount(len(rows))
    for r, cells in enumerate(rows):
        for c, text in enumerate(cells):
            table.setItem(r, c, QTableWidgetItem(text))
    fit_columns(table)


def _finite(samples: list[float]) -> np.ndarray:
    return np.asarray([s for s in samples if s is not None and np.isfinite(s)], dtype=float)


def _sample_scale(unit: str, samples: list[float]) -> tuple[float, str]:
    """(divisor, unit label) for showing ``samples``: bytes in the binary unit that fits their median."""
    from opscope.engine import display_scale

    values = _finite(samples)
    return display_scale(unit, float(np.median(values)) if len(values) else 0.0)


def _histogram(plot: pg.PlotItem, samples: list[float], color: str, name: str, divisor: float = 1.0) -> int:
    """Draw the histogram of ``samples / divisor``; returns the tallest bin's count."""
    values = _finite(samples)
    if not len(values):
        return 0
    bins = max(5, min(40, int(np.sqrt(len(values))) * 2))
    counts, edges = np.histogram(values / divisor, bins=bins)
    plot.plot(
        edges,
        counts,
        stepMode="center",
        fillLevel=0,
        brush=pg.mkBrush(QColor(color).red(), QColor(color).green(), QColor(color).blue(), 70),
        pen=pg.mkPen(color, width=1.5),
        name=name,
    )
    return int(counts.max())


def _count_axis(plot: pg.PlotItem, tallest: int) -> None:
    """Whole-number ticks on a count axis (3 samples must not read 0.5, 1.5, 2.5)."""
    rough = max(tallest / 5, 1.0)
    magnitude = 10 ** int(np.floor(np.log10(rough)))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= rough)  # 1, 2, 5, 10, 20…: never 11
    plot.getAxis("left").setTickSpacing(step, step)
    plot.setLabel("left", "repetitions")


def _series_values(series) -> tuple[np.ndarray, str]:
    """A telemetry series' values and unit label, bytes in a binary unit."""
    from opscope.engine import display_scale

    values = np.asarray(series.values, dtype=float)
    finite = values[np.isfinite(values)]
    divisor, label = display_scale(series.unit, float(np.median(finite)) if len(finite) else 0.0)
    return values / divisor, label


def _keyed(title: str, keys: list[tuple[str, str]]) -> str:
    """``title`` followed by a coloured key per line (the legend, in the title row)."""
    return (
        title
        + "&nbsp;&nbsp;"
        + "&nbsp;&nbsp;".join(f"<span style='color:{c}'>━</span>&nbsp;{name}" for name, c in keys)
    )


def _telemetry_series(result) -> object | None:
    by_name = {s.name: s for s in result.telemetry}
    return next((by_name[n] for n in TELEMETRY_PREFERENCE if n in by_name), next(iter(by_name.values()), None))


class RunDetailView(QWidget):
    """Metrics (median ± CI from the raw samples), a histogram of the selected metric, telemetry,
    and the environment fingerprint."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.header = QLabel("Select a run and press Open.", objectName="panelHint", wordWrap=True)
        self.metrics = _table(["metric", "params", "median", "95% CI", "n", "unit", "status"])
        keep_in_view(self.metrics, elastic=(0, 1, 6))  # names, params and errors elide; numbers never
        self.histogram = pg.PlotWidget(title="raw samples of the selected metric")
        self.telemetry = pg.PlotWidget(title="telemetry during the run")
        for plot in (self.histogram, self.telemetry):
            plot.setMinimumHeight(140)  # shorter, a small window squeezed the y ticks over each other
        self.fingerprint = QTreeWidget(headerLabels=["field", "value"])
        plots = QTabWidget()
        plots.addTab(self.histogram, "Distribution")
        plots.addTab(self.telemetry, "Telemetry")
        plots.addTab(self.fingerprint, "Fingerprint")
        split = QSplitter(Qt.Vertical)
        split.addWidget(self.metrics)
        split.addWidget(plots)
        split.setStretchFactor(0, 3)  # the rows are what a compare is for: the table gets most of the height
        split.setStretchFactor(1, 2)
        split.setSizes([300, 200])
        layout = QVBoxLayout(self)
        layout.addWidget(self.header)
        layout.addWidget(split, 1)
        self.run = None
        self.metrics.currentCellChanged.connect(lambda row, *_: self.show_metric(row))

    def show_run(self, stored) -> None:
        from opscope.engine import summarize

        self.run = stored
        info, result = stored.info, stored.result
        self.header.setText(
            f"<b>{info.name}</b> (id {info.id}) · {info.kind} · {info.status}"
            f" · quality {info.quality or 'unknown'}"
            f"{' · ' + info.error if info.error else ''} · {info.created_at:%Y-%m-%d %H:%M} · "
            f"tags: {', '.join(info.tags) or '–'}"
        )
        rows = []
        for m in result.metrics:
            s = summarize(m.samples) if m.samples else None
            rows.append(
                [
                    m.name,
                    _params(m.params),
                    with_unit(s.median, m.unit) if s else "–",
                    f"{with_unit(s.ci_low, m.unit)} … {with_unit(s.ci_high, m.unit)}" if s else "–",
                    str(len(m.samples)),
                    m.unit,
                    m.status if m.status == "ok" else f"{m.status}: {m.error}",
                ]
            )
        _fill(self.metrics, rows)
        self._show_telemetry(result)
        self._show_fingerprint(result.fingerprint)
        if rows:
            self.metrics.selectRow(0)
            self.show_metric(0)

    def show_metric(self, row: int) -> None:
        self.histogram.clear()
        if self.run is None or not 0 <= row < len(self.run.result.metrics):
            return
        m = self.run.result.metrics[row]
        divisor, unit = _sample_scale(m.unit, m.samples)
        self.histogram.setLabel("bottom", f"{m.name} ({unit or 'no unit'})")
        _count_axis(
            self.histogram.getPlotItem(),
            _histogram(self.histogram.getPlotItem(), m.samples, LINE_COLORS[0], m.name, divisor),
        )

    def _show_telemetry(self, result) -> None:
        self.telemetry.clear()
        series = _telemetry_series(result)
        if series is None or not series.t_ns:
            self.telemetry.setTitle("no telemetry was recorded with this run")
            return
        t = (np.asarray(series.t_ns) - series.t_ns[0]) / 1e9
        values, unit = _series_values(series)
        self.telemetry.setTitle(f"{series.name} ({unit})")
        self.telemetry.plot(t, values, pen=pg.mkPen(LINE_COLORS[0], width=1.5))
        self.telemetry.setLabel("left", unit)
        self.telemetry.setLabel("bottom", "seconds since the run started")

    def _show_fingerprint(self, fingerprint: dict) -> None:
        self.fingerprint.clear()
        _tree(self.fingerprint.invisibleRootItem(), fingerprint)
        self.fingerprint.expandToDepth(0)
        self.fingerprint.resizeColumnToContents(0)


def _tree(parent, value) -> None:
    for key, item in value.items() if isinstance(value, dict) else enumerate(value):
        if isinstance(item, (dict, list)) and item:
            node = QTreeWidgetItem(parent, [str(key), ""])
            _tree(node, item)
        else:
            QTreeWidgetItem(parent, [str(key), json.dumps(item, default=str) if not isinstance(item, str) else item])


def _params(params: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(params.items()))


class CompareView(QWidget):
    """Two or more runs: per-metric medians ± CI, Δ% with Mann-Whitney p (`~` = no significant
    change), the fingerprint fields that differ, overlaid distributions and telemetry."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.header = QLabel("Select two or more runs and press Compare.", objectName="panelHint", wordWrap=True)
        self.table = _table(["metric"])
        self.diff = _table(["field"])
        keep_in_view(self.table, elastic=(0,))
        self.table.verticalHeader().setDefaultSectionSize(self.fontMetrics().lineSpacing() + 8)  # one-line rows
        # Keys in the title row, not a legend box over the bars and lines.
        self.distributions = pg.PlotWidget(title="raw samples of the selected metric, per run")
        self.telemetry = pg.PlotWidget(title="telemetry, per run")
        for plot in (self.distributions, self.telemetry):  # room for a few count ticks and the axis title
            plot.setMinimumHeight(DISTRIBUTION_MIN_PX)
        tabs = QTabWidget()
        tabs.addTab(self.distributions, "Distributions")
        tabs.addTab(self.telemetry, "Telemetry")
        tabs.addTab(self.diff, "Fingerprint diff")
        split = QSplitter(Qt.Vertical)  # the table gets the full width: it has a column per run
        split.addWidget(self.table)
        split.addWidget(tabs)
        split.setStretchFactor(0, 3)  # the rows are what a compare is for: the table gets most of the height
        split.setStretchFactor(1, 2)
        split.setSizes([250, 250])
        layout = QVBoxLayout(self)
        layout.addWidget(self.header)
        layout.addWidget(split, 1)
        self.comparison, self.runs, self._rows = None, [], []
        self.table.currentCellChanged.connect(lambda row, *_: self.show_row(row))

    def show_comparison(self, comparison, runs) -> None:
        self.comparison, self.runs = comparison, runs
        names = [r.name for r in comparison.runs]
        self.header.setText(compare_header(comparison))
        from opscope.engine import compare_footnotes

        self.header.setToolTip("\n".join(compare_footnotes(comparison)))  # the whole story, on hover
        self._fill_table(comparison, names)
        self._fill_diff(comparison, names)
        keep_in_view(self.diff, elastic=range(self.diff.columnCount()))  # long fingerprint values elide
        self._show_telemetry(runs)
        if self._rows:
            self.table.selectRow(0)
            self.show_row(0)

    def _fill_table(self, comparison, names: list[str]) -> None:
        from opscope.engine import cell_text, delta_text, disturbed_text

        headers = ["metric", "unit"] + names + [f"Δ {n}" for n in names[1:]]
        self.table.setColumnCount(len(headers))
        self.table.setHorizontalHeaderLabels(headers)
        self._rows = [row for section in comparison.sections for row in section.rows]
        _fill(
            self.table,
            [
                [row.label, row.unit]
                + [cell_text(c, row.unit) for c in row.cells]
                + [short_delta(d, bool(row.disturbed_pair(i))) for i, d in enumerate(row.deltas, start=1)]
                for row in self._rows
            ],
        )
        for r, row in enumerate(self._rows):
            for i, d in enumerate(row.deltas, start=1):
                item = self.table.item(r, 1 + len(names) + i)
                # the test's p and counts, and who was disturbed, on hover: the cell stays short
                item.setToolTip((delta_text(d) + disturbed_text(comparison, row, i, d)).strip())
                if row.disturbed_pair(i):  # a change measured under foreign load is not a result
                    item.setForeground(DISTURBED)
                    font = item.font()
                    font.setItalic(True)
                    item.setFont(font)
                elif d is not None and d.significant:
                    item.setForeground(WORSE if d.worse else BETTER)

    def _fill_diff(self, comparison, names: list[str]) -> None:
        self.diff.setColumnCount(1 + len(names))
        self.diff.setHorizontalHeaderLabels(["field"] + names)
        _fill(
            self.diff,
            [
                [field] + [json.dumps(v, default=str) if not isinstance(v, str) else v for v in values]
                for field, values in comparison.differences
            ],
        )

    def show_row(self, row: int) -> None:
        self.distributions.clear()
        if not 0 <= row < len(self._rows):
            return
        key = self._rows[row]
        tallest, keys = 0, []
        metrics = [
            (
                i,
                run,
                next(
                    (
                        m
                        for m in run.result.metrics
                        if m.name == key.name and m.unit == key.unit and m.params == key.params
                    ),
                    None,
                ),
            )
            for i, run in enumerate(self.runs)
        ]
        metrics = [(i, run, m) for i, run, m in metrics if m is not None]
        # One scale for every run (the first's), so the histograms stay comparable.
        divisor, unit = _sample_scale(key.unit, metrics[0][2].samples if metrics else [])
        for i, run, metric in metrics:
            color = LINE_COLORS[i % len(LINE_COLORS)]
            tallest = max(
                tallest, _histogram(self.distributions.getPlotItem(), metric.samples, color, run.info.name, divisor)
            )
            keys.append((run.info.name, color))
        self.distributions.setTitle(_keyed("raw samples per run", keys))
        self.distributions.setLabel("bottom", f"{key.name} ({unit or 'no unit'})")
        _count_axis(self.distributions.getPlotItem(), tallest)

    def _show_telemetry(self, runs) -> None:
        self.telemetry.clear()
        drawn = []
        for i, run in enumerate(runs):
            series = _telemetry_series(run.result)
            if series is not None and series.t_ns:
                t = (np.asarray(series.t_ns) - series.t_ns[0]) / 1e9
                values, unit = _series_values(series)
                self.telemetry.plot(
                    t,
                    values,
                    name=f"{run.info.name}: {series.name} ({unit})",
                    pen=pg.mkPen(LINE_COLORS[i % len(LINE_COLORS)], width=1.5),
                )
                drawn.append((f"{run.info.name}: {series.name} ({unit})", LINE_COLORS[i % len(LINE_COLORS)]))
        names = [d[0].split(": ", 1)[0] for d in drawn]
        missing = [r.info.name for r in runs if r.info.name not in names]
        if not drawn:
            self.telemetry.setTitle("No telemetry to compare: none of these runs recorded any")
        else:
            self.telemetry.setTitle(
                _keyed("telemetry", drawn) + (f" · none recorded for {', '.join(missing)}" if missing else "")
            )
        self.telemetry.setLabel("bottom", "seconds since each run started")
