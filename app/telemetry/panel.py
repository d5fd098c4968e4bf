"""The Telemetry panel: live pyqtgraph plots over TelemetryModel, phase bands, crosshair, export.

Kept cheap on purpose (pyqtgraph's scrollingPlots/PlotSpeedTest menu): each refresh reads only the
visible window from the sampler's ring buffer, curves clip to the view and downsample by peak, and
band items come from a fixed pool instead of being created per marker.
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from opscope.app.telemetry.bands import PhaseBands
from opscope.app.telemetry.model import TelemetryModel
from opscope.app.telemetry.plots import (
    GPU_PLOTS,
    HOST_PLOTS,
    LINE_COLORS,
    REASONS_SUFFIX,
    PlotSpec,
    line_scale,
    lines_for,
    reason_names,
)
from opscope.app.ui.notify import export_guard
from opscope.app.ui.theme import PHASE_COLORS
from opscope.app.ui.widgets import shrinkable, wrapped_key
from opscope.engine import now_ns
from PySide6.QtCore import QEvent, QRectF, Qt, QTimer
from PySide6.QtGui import QColor, QFontMetrics
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QGraphicsItem,
    QHBoxLayout,
    QLabel,
    QMenu,
    QPushButton,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

WINDOWS_S = (("30 s", 30), ("1 min", 60), ("5 min", 300), ("15 min", 900), ("1 h", 3600))
MAX_BANDS = 2000  # the newest bands in the window; a long benchmark marks every repetition
RANKS_ROW = 100  # below every host and GPU plot, however many GPUs appear later
COMM_PHASE = "all_reduce"  # a tensor-parallel rank's communication inside its forwards
READOUT_HINT = "Move the mouse over a plot to read values."
IDLE_REFRESH_MS = 1000  # while the engine waits: the plots move once a second, not ten times


def _lane(phases, rank: int, until_ns: int) -> tuple[np.ndarray, np.ndarray]:
    """(x seconds before ``until_ns``, y = the rank) of each phase as a segment, NaN-separated."""
    xs, ys = [], []
    for p in phases:
        end = p.end_ns if p.end_ns is not None else until_ns
        xs += [(p.start_ns - until_ns) / 1e9, (end - until_ns) / 1e9, np.nan]
        ys += [float(rank)] * 2 + [np.nan]
    return np.array(xs), np.array(ys)


def _phase_legend() -> str:
    swatches = " ".join(
        f"<span style='background-color: rgb{rgb}'>&nbsp;&nbsp;&nbsp;</span> {name.replace('_', ' ')}"
        for name, rgb in PHASE_COLORS.items()
    )
    return f"Shaded phases: {swatches}"


class TelemetryPanel(QWidget):
    def __init__(self, model: TelemetryModel, parent: QWidget | None = None, *, refresh_ms: int = 100) -> None:
        super().__init__(parent)
        self.model = model
        self.window_s = 60
        self.paused = False
        self.plots: dict[str, pg.PlotItem] = {}
        self.curves: dict[str, pg.PlotDataItem] = {}
        self.bands: dict[str, PhaseBands] = {}
        self.cursors: list[pg.InfiniteLine] = []
        self.rank_plot: pg.PlotItem | None = None  # appears with the first phase that carries a rank
        self.rank_curves: dict[int, pg.PlotDataItem] = {}
        self.rank_comm_curves: dict[int, pg.PlotDataItem] = {}  # all_reduce spans over a rank's forwards
        self.gpu_note = QLabel(objectName="panelHint", wordWrap=True, visible=False)
        self._entities: list[str] | None = None
        self._scale: dict[str, float] = {}
        self._units: dict[str, str] = {}
        self._lanes: dict[str, tuple[str, int, int]] = {}  # lane curve -> (bitmask series, bit, lane)
        self._specs: dict[str, PlotSpec] = {}
        self._keys: dict[str, list[tuple[str, str, bool]]] = {}  # plot -> its lines' (label, colour, dashed)
        self.refresh_count = 0
        self.now_ns = now_ns()  # the time x = 0 stands for in the last refresh
        self._colors: tuple[str, str] | None = None
        self._build_controls()
        self.graphics = pg.GraphicsLayoutWidget()
        self._retitle_timer = QTimer(self, singleShot=True, interval=0, timeout=self._retitle)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addLayout(self._controls)
        layout.addWidget(self.readout)
        layout.addWidget(self.gpu_note)
        layout.addWidget(QLabel(_phase_legend(), objectName="statsLine", wordWrap=True))  # wraps in a narrow dock
        layout.addWidget(self.graphics, 1)
        for spec in HOST_PLOTS:
            self._add_plot(spec)
        self._mouse = pg.SignalProxy(self.graphics.scene().sigMouseMoved, rateLimit=30, slot=self._on_mouse)
        self.graphics.viewport().installEventFilter(self)  # the mouse leaving clears the crosshair
        self.refresh_ms = refresh_ms
        self.timer = QTimer(self, interval=refresh_ms, timeout=self.refresh)
        self.timer.start()
        client = getattr(model, "client", None)
        if client is not None and hasattr(client, "stateChanged"):
            client.stateChanged.connect(self.follow_engine)
            self.follow_engine(client.state)

    # -- construction ---------------------------------------------------------------------------
    def _build_controls(self) -> None:
        self.window_combo = QComboBox()
        for label, seconds in WINDOWS_S:
            self.window_combo.addItem(label, seconds)
        self.window_combo.setCurrentIndex(1)
        self.window_combo.currentIndexChanged.connect(lambda _i: self.set_window(self.window_combo.currentData()))
        self.pause_button = QPushButton("Pause", checkable=True, toggled=self.set_paused)
        # On its own full-width line, wrapping: every series with its unit must stay readable.
        self.readout = QLabel(READOUT_HINT, objectName="statsLine", wordWrap=True)
        self.readout.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Minimum)  # long readouts never widen the window
        self._controls = QHBoxLayout()
        self._controls.addWidget(QLabel("Window"))
        self._controls.addWidget(self.window_combo)
        self._controls.addWidget(self.pause_button)
        # One "Export" button with its two formats: the row must fit a narrow dock at 1024 px.
        self.export_button = QPushButton("Export", toolTip="Save the plots as a PNG image or their series as CSV")
        menu = QMenu(self.export_button)
        menu.addAction("PNG image…", self.export_png_dialog)
        menu.addAction("CSV data…", self.export_csv_dialog)
        self.export_button.setMenu(menu)
        self._controls.addWidget(self.export_button)
        self._controls.addStretch(1)
        shrinkable(self.pause_button)

    def _add_plot(self, spec: PlotSpec) -> pg.PlotItem:
        plot = self.graphics.addPlot(row=len(self.plots), col=0)
        self._specs[spec.key], self._keys[spec.key] = spec, []
        plot.showGrid(x=True, y=True, alpha=0.2)
        plot.setDownsampling(auto=True, mode="peak")
        plot.setClipToView(True)
        plot.setMouseEnabled(x=False, y=False)  # the window follows "now"; pause to explore
        plot.getAxis("bottom").setLabel("seconds ago")
        plot.getAxis("left").setLabel(spec.unit)
        if spec.lanes:
            plot.getAxis("left").setTicks([[(i, name) for i, name in enumerate(reason_names())]])
            plot.setYRange(-0.5, len(reason_names()) - 0.5, padding=0)
        else:
            # An invisible point at 0 keeps zero in the auto range: an RSS of 1 GiB reads against a
            # 0 on the axis, not a floating line at the bottom of a 1..24 GiB plot.
            plot.addItem(pg.ScatterPlotItem([0.0], [0.0], size=0, pen=None, brush=None))
        for side in ("left", "bottom"):
            # The grid belongs to the axis item and spans the plot, so every curve update would
            # repaint (re-rasterize) the axis text; a device cache turns that into a blit. The
            # x range is fixed (-window..0, "seconds ago"), so the cache rarely goes stale.
            plot.getAxis(side).setCacheMode(QGraphicsItem.DeviceCoordinateCache)
        if self.plots:
            plot.setXLink(next(iter(self.plots.values())))
        self.plots[spec.key] = plot
        self._set_title(spec.key)
        self.bands[spec.key] = PhaseBands(PHASE_COLORS)
        plot.addItem(self.bands[spec.key], ignoreBounds=True)
        if self._colors:
            self._theme_plot(plot, self._colors[1], self._colors[0])
        cursor = pg.InfiniteLine(angle=90, movable=False, pen=pg.mkPen("#a0aec0", style=Qt.DashLine))
        cursor.setVisible(False)
        plot.addItem(cursor, ignoreBounds=True)
        self.cursors.append(cursor)
        return plot

    def _sync_curves(self) -> None:
        """Create curves for series that appeared (sources open in the background)."""
        names = set(self.model.names())
        entities = self.model.gpu_entities()
        if entities != self._entities or not (entities or self.gpu_note.text()):
            self._entities = entities
            self._sync_gpu_plots(entities)
        specs = HOST_PLOTS + (GPU_PLOTS if entities else ())
        for spec in specs:
            for i, (name, label, dashed) in enumerate(lines_for(spec, entities)):
                base = name.split(REASONS_SUFFIX)[0]
                if base in names and name not in self.curves and (not spec.per_gpu or self._reported(base)):
                    self._add_curve(spec, name, label, dashed, i)

    def _reported(self, name: str) -> bool:
        """Whether the device reports ``name`` (NVML answers N/A, i.e. NaN, for what it does not)."""
        _t, values = self.model.series(name, now_ns() - 10 * 10**9)
        return bool(np.isfinite(values).any())

    def _sync_gpu_plots(self, entities: list[str]) -> None:
        if entities:
            self.gpu_note.setVisible(False)
            for spec in GPU_PLOTS:
                if spec.key not in self.plots:
                    self._add_plot(spec)
        elif self.model.sampler.status().get("nvml", "not opened") != "not opened":
            self.gpu_note.setText(f"No GPU plots: {self.model.gpu_reason()}. Host plots stay live.")
            self.gpu_note.setVisible(True)

    def _add_curve(self, spec: PlotSpec, name: str, label: str, dashed: bool, index: int) -> None:
        color = LINE_COLORS[index % len(LINE_COLORS)]
        # Width 1 keeps Qt on its fast path for thin lines: a 1.5 px pen strokes an hour of noisy
        # data ~100x slower (13 s vs 0.12 s per frame, benchmarks/gui_fps.py).
        pen = pg.mkPen(color, width=1, style=Qt.DashLine if dashed else Qt.SolidLine)
        # Peak downsampling keeps each bucket's min and max: one bucket per pixel column already
        # draws the exact envelope (pyqtgraph's default of 5 per pixel draws 5x the points).
        curve = self.plots[spec.key].plot(name=label, pen=pen, connect="finite", autoDownsampleFactor=1.0)
        key_label = label.rsplit(" ", 1)[0] if spec.lanes else label  # lanes: the axis names the reason
        if key_label not in [k[0] for k in self._keys[spec.key]]:
            self._keys[spec.key].append((key_label, color, dashed))
            self._set_title(spec.key)
        curve.setDownsampling(auto=True, method="peak")
        curve.setClipToView(True)
        self.curves[name] = curve
        base, _, reason = name.partition(REASONS_SUFFIX)
        self._scale[name] = line_scale(spec, base)
        self._units[name] = spec.unit
        if spec.lanes:
            from opscope.engine import NVML_REASON_BITS as REASON_BITS

            lane = reason_names().index(reason)
            self._lanes[name] = (base, REASON_BITS[lane][0], lane)
            curve.setPen(pg.mkPen(color, width=4))  # a lane reads as a bar while the reason is active

    def _set_title(self, key: str) -> None:
        """Title, unit and the key of every line, in the title row: a legend inside the plot would
        cover the data (the 100 % line of the CPU plot sits right where a legend goes). In a
        narrow dock the key wraps onto more lines: a pyqtgraph title never wraps by itself, and
        one wider than the view would push the plot past the dock's edge, cut off."""
        spec = self._specs[key]
        items = [(f"<b>{spec.title}</b> ({spec.unit})", f"{spec.title} ({spec.unit})")]
        items += [
            (f"<span style='color:{c}'>{'┅' if dashed else '━'}</span>&nbsp;{label}", f"━ {label}")
            for label, c, dashed in self._keys[key]
        ]
        # less the margins and the left axis: the title sits over the data
        text = wrapped_key(items, max(self.graphics.width() - 90, 120), self._title_px)
        foreground = self._colors[1] if self._colors else None
        self.plots[key].setTitle(text, size="9pt", **({"color": foreground} if foreground else {}))

    def _title_px(self, text: str) -> int:
        """How wide ``text`` is in the plots' 9 pt title font, in pixels."""
        font = self.font()
        font.setPointSize(9)
        return QFontMetrics(font).horizontalAdvance(text) + 2

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        # Re-wrapped after the event, never inside it: a resize may come in the middle of a paint
        # (grab), where changing the scene's items crashes.
        self._retitle_timer.start()

    def _retitle(self) -> None:
        for key in self.plots:
            self._set_title(key)
        # The plots were fitted to the view under the old titles' minimum width: fit them again
        # once the new titles' sizes are laid out.
        QTimer.singleShot(0, lambda: self.graphics.ci.setGeometry(QRectF(self.graphics.viewport().rect())))

    # -- live update ----------------------------------------------------------------------------
    def set_window(self, seconds: int) -> None:
        self.window_s = int(seconds)
        self.refresh(force=True)

    def set_paused(self, paused: bool) -> None:
        """Freeze the view (sampling goes on, nothing is lost); pan and zoom work while paused."""
        self.paused = paused
        self.pause_button.setText("Resume" if paused else "Pause")
        for plot in self.plots.values():
            plot.setMouseEnabled(x=paused, y=False)
        if not paused:
            self.refresh()

    def refresh(self, force: bool = False) -> None:
        if (self.paused or not self.isVisible()) and not force:
            return  # a hidden (tabbed-away) or paused panel costs nothing
        self._sync_curves()
        now = now_ns()
        since = now - self.window_s * 10**9
        self.now_ns = now
        for name, curve in self.curves.items():
            if name in self._lanes:
                base, bit, lane = self._lanes[name]
                t_ns, mask = self.model.series(base, since)
                active = np.isfinite(mask) & ((np.nan_to_num(mask).astype(np.int64) & bit) != 0)
                curve.setData((t_ns - now) / 1e9, np.where(active, float(lane), np.nan))
                continue
            t_ns, values = self.model.series(name, since)
            curve.setData((t_ns - now) / 1e9, values * self._scale[name])
        first = next(iter(self.plots.values()))
        first.setXRange(-self.window_s, 0, padding=0)
        self._update_bands(since, now)
        self.refresh_count += 1

    def _update_bands(self, since_ns: int, until_ns: int) -> None:
        phases = self.model.phases_between(since_ns, until_ns, MAX_BANDS)
        bands = [
            (
                p.phase,
                (p.start_ns - until_ns) / 1e9,
                ((p.end_ns if p.end_ns is not None else until_ns) - until_ns) / 1e9,
            )
            for p in phases
            if "rank" not in p.attrs
        ]  # a rank's phases go on the Ranks track
        for item in self.bands.values():
            item.set_bands(bands)
        self._update_ranks(self.model.rank_spans(phases), until_ns)

    # -- ranks ----------------------------------------------------------------------------------
    def _update_ranks(self, spans: dict, until_ns: int) -> None:
        """One lane per rank (rank 0 on top), each phase a thick segment: stragglers stand out. A
        tensor-parallel rank's all_reduces are a thinner segment of their own colour over its
        forwards, so each step's share of communication shows."""
        if not spans and self.rank_plot is None:
            return
        if self.rank_plot is None:
            self._add_rank_plot()
        for rank in sorted(spans):
            comm = [p for p in spans[rank] if p.phase == COMM_PHASE]
            rest = [p for p in spans[rank] if p.phase != COMM_PHASE]
            self._rank_curve(rank).setData(*_lane(rest, rank, until_ns), connect="finite")
            if comm or rank in self.rank_comm_curves:
                self._rank_comm_curve(rank).setData(*_lane(comm, rank, until_ns), connect="finite")
        lanes = sorted(set(self.rank_curves) | set(spans))
        self.rank_plot.getAxis("left").setTicks([[(r, f"rank {r}") for r in lanes]])
        self.rank_plot.setYRange(-0.5, max(lanes) + 0.5, padding=0)

    def _add_rank_plot(self) -> None:
        plot = self.graphics.addPlot(row=RANKS_ROW, col=0)
        plot.setTitle("Ranks (collectives, forwards and their all_reduces per process, one time axis)")
        plot.setMouseEnabled(x=False, y=False)
        plot.invertY(True)  # rank 0 on top, as in the Perfetto export
        plot.setMaximumHeight(200)
        plot.getAxis("bottom").setLabel("seconds ago")
        plot.setXLink(next(iter(self.plots.values())))
        if self._colors:
            self._theme_plot(plot, self._colors[1], self._colors[0])
        self.rank_plot = plot

    def _rank_curve(self, rank: int) -> pg.PlotDataItem:
        curve = self.rank_curves.get(rank)
        if curve is None:
            color = LINE_COLORS[rank % len(LINE_COLORS)]
            curve = self.rank_curves[rank] = self.rank_plot.plot(pen=pg.mkPen(color, width=8))
        return curve

    def _rank_comm_curve(self, rank: int) -> pg.PlotDataItem:
        curve = self.rank_comm_curves.get(rank)
        if curve is None:
            color = LINE_COLORS[(rank + len(LINE_COLORS) // 2) % len(LINE_COLORS)]
            curve = self.rank_comm_curves[rank] = self.rank_plot.plot(pen=pg.mkPen(color, width=4))
        return curve

    def follow_engine(self, state: str) -> None:
        """Redraw at ``refresh_ms`` while the engine works, at IDLE_REFRESH_MS while it waits: every
        redraw repaints every plot (the x axis follows "now"), and with software rendering that
        kept an idle window at ~11 % of a core."""
        interval = self.refresh_ms if state in ("busy", "starting") else max(self.refresh_ms, IDLE_REFRESH_MS)
        if self.timer.interval() != interval:
            self.timer.setInterval(interval)
            if interval == self.refresh_ms:
                self.refresh()  # the first busy frame at once, not up to a second late

    # -- crosshair ------------------------------------------------------------------------------
    def eventFilter(self, watched, event) -> bool:
        if watched is self.graphics.viewport() and event.type() == QEvent.Leave:
            self.clear_crosshair()
        return False

    def clear_crosshair(self) -> None:
        """No value is read where the mouse no longer is: the cursors hide, the hint is back."""
        for cursor in self.cursors:
            cursor.setVisible(False)
        self.readout.setText(READOUT_HINT)

    def _on_mouse(self, event) -> None:
        pos = event[0]
        plot = next((p for p in self.plots.values() if p.sceneBoundingRect().contains(pos)), None)
        if plot is None:
            self.clear_crosshair()
            return
        x = plot.vb.mapSceneToView(pos).x()
        for cursor in self.cursors:
            cursor.setPos(x)
            cursor.setVisible(True)
        self.readout.setText(self.readout_at(x))

    def readout_at(self, x_s: float) -> str:
        phases = next(iter(self.bands.values())).phases_at(x_s) if self.bands else []
        parts = [f"{-x_s:.1f} s ago" + (f" [{', '.join(phases)}]" if phases else "")]
        for name, curve in self.curves.items():
            xs, ys = curve.getOriginalDataset()
            if xs is None or not len(xs):
                continue
            i = int(np.clip(np.searchsorted(xs, x_s), 0, len(xs) - 1))
            if not np.isfinite(ys[i]):
                continue
            if name in self._lanes:
                parts.append(f"{curve.name()} active")
            else:
                parts.append(f"{curve.name()} {ys[i]:.3g} {self._units[name]}")
        return " · ".join(parts)

    # -- export / theme -------------------------------------------------------------------------
    def export_png(self, path: str) -> bool:
        return self.graphics.grab().save(path)

    def export_csv(self, path: str) -> int:
        return self.model.export_csv(path, now_ns() - self.window_s * 10**9)

    def export_png_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export plots", "telemetry.png", "PNG (*.png)")
        if path:
            with export_guard(self, "export the telemetry plots", path):
                if not self.export_png(path):
                    raise OSError("Qt could not write a PNG there (check the folder and its permissions)")

    def export_csv_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export telemetry", "telemetry.csv", "CSV (*.csv)")
        if path:
            with export_guard(self, "export the telemetry", path):
                self.export_csv(path)

    def apply_theme(self, background: str, foreground: str) -> None:
        self._colors = (background, foreground)
        self.graphics.setBackground(background)
        for plot in self.plots.values():
            self._theme_plot(plot, foreground, background)

    @staticmethod
    def _theme_plot(plot: pg.PlotItem, foreground: str, background: str) -> None:
        for side in ("left", "bottom"):
            axis = plot.getAxis(side)
            axis.setPen(foreground)
            axis.setTextPen(foreground)
        plot.titleLabel.setText(plot.titleLabel.text, color=foreground)
        if plot.legend is not None:
            backdrop = QColor(background)
            backdrop.setAlpha(210)  # readable over curves and phase bands
            plot.legend.setBrush(backdrop)
            plot.legend.setLabelTextColor(foreground)
            for _sample, label in plot.legend.items:
                label.setText(label.text)  # LabelItem re-renders its colour only on setText
            plot.legend.setZValue(100)

    def shutdown(self) -> None:
        self.timer.stop()
        self.model.stop()
