"""Telemetry panel redraw rate with an hour of 10 Hz history (36,000 samples per series).

    QT_QPA_PLATFORM=offscreen .venv/bin/python benchmarks/gui_fps.py [--rounds 5] [--frames 20]

One frame = what the panel's timer does (read the window from the ring buffers, setData on every
curve, move the bands) plus a synchronous repaint of the plots. Variants run interleaved
(A B A B ...) in the same process so a busy machine hits them alike; the report gives the median
frame time, its spread (min … max over rounds) and frames/s, and the ratio to the app's settings.

Variants:
  app         the panel as shipped: peak downsampling, clip to view, cached axes
  no-ds-clip  the same panel with downsampling and clip-to-view turned off (the naive way)
Each at window = 1 h and 5 min, with --gpus fake GPUs (default 2: the panel's full set of GPU
plots) and the host. The data is uniform noise, the worst case for drawing: every pixel column
spans the plot's height.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np
from opscope.app.telemetry.model import TelemetryModel
from opscope.app.telemetry.panel import TelemetryPanel
from opscope.engine.core.clock import now_ns
from PySide6.QtCore import QEvent, QObject
from PySide6.QtWidgets import QApplication

HOUR_TICKS = 36_000
PERIOD_NS = 100_000_000
GPU_FIELDS = (
    "util_pct",
    "mem_used_bytes",
    "mem_total_bytes",
    "power_w",
    "power_limit_w",
    "temp_c",
    "sm_clock_mhz",
    "mem_clock_mhz",
)


def filled_model(gpus: int) -> TelemetryModel:
    """An unstarted model whose history holds one hour of 10 Hz samples, plus phase markers."""
    model = TelemetryModel(None, interval_ms=100, history_s=3600, sources=[])
    rng = np.random.default_rng(0)
    t_end = now_ns()
    noise = rng.random((HOUR_TICKS, 4))
    for k in range(HOUR_TICKS):
        t = t_end - (HOUR_TICKS - k) * PERIOD_NS
        values = {
            "host.cpu_pct": 100 * noise[k, 0],
            "host.ram_used_bytes": 8e9 + 1e8 * noise[k, 1],
            "host.ram_total_bytes": 32e9,
            "engine.rss_bytes": 2e9 + 1e7 * noise[k, 2],
            "engine.cpu_pct": 100 * noise[k, 3],
        }
        for gpu in (f"gpu{i}" for i in range(gpus)):
            values.update({f"{gpu}.{f}": 50.0 + 40 * noise[k, i % 4] for i, f in enumerate(GPU_FIELDS)})
        model.sampler.history.append(t, values)
    for k in range(0, HOUR_TICKS, 300):  # a generation every 30 s: prefill then decode
        t = t_end - (HOUR_TICKS - k) * PERIOD_NS
        for phase, a, b in (("prefill", 0, 5), ("decode", 5, 60)):
            model.on_marker({"phase": phase, "edge": "start", "t_ns": t + a * PERIOD_NS})
            model.on_marker({"phase": phase, "edge": "end", "t_ns": t + b * PERIOD_NS})
    return model


def make_panel(model: TelemetryModel, variant: str, window_s: int) -> TelemetryPanel:
    panel = TelemetryPanel(model, refresh_ms=10_000_000)  # frames are driven by hand
    panel.timer.stop()
    panel.resize(900, 1400)
    panel.show()
    panel.window_s = window_s
    panel.refresh(force=True)
    if variant == "no-ds-clip":
        for plot in panel.plots.values():
            plot.setDownsampling(auto=False, ds=1)
            plot.setClipToView(False)
        for curve in panel.curves.values():
            curve.setDownsampling(ds=1, auto=False)
            curve.setClipToView(False)
    return panel


class PaintCounter(QObject):
    """Counts paint events of a widget: a frame is only counted as drawn when one happened."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def eventFilter(self, _obj, event) -> bool:
        if event.type() == QEvent.Paint:
            self.count += 1
        return False


def frame_ms(app: QApplication, panel: TelemetryPanel, frames: int) -> float:
    """Mean wall time of ``frames`` frames as the app does them: the timer's refresh, then the
    event loop paints (exactly once per frame, checked)."""
    counter = PaintCounter()
    panel.graphics.viewport().installEventFilter(counter)
    t0 = time.perf_counter()
    for _ in range(frames):
        panel.refresh(force=True)
        app.processEvents()
    elapsed_ms = (time.perf_counter() - t0) * 1e3
    panel.graphics.viewport().removeEventFilter(counter)
    if counter.count < frames:
        raise RuntimeError(f"only {counter.count} paints for {frames} frames: the measurement is void")
    return elapsed_ms / frames


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--frames", type=int, default=20)
    ap.add_argument("--gpus", type=int, default=2, help="fake GPUs (each adds 8 series on 5 plots)")
    args = ap.parse_args()
    app = QApplication.instance() or QApplication([])
    model = filled_model(args.gpus)
    variants = [(v, w) for w in (3600, 300) for v in ("app", "no-ds-clip")]
    panels = {key: make_panel(model, *key) for key in variants}
    for panel in panels.values():
        frame_ms(app, panel, 2)  # warm-up: first paint builds caches
    results: dict[tuple, list[float]] = {key: [] for key in variants}
    for _ in range(args.rounds):
        for key in variants:  # interleaved: A B A B ...
            results[key].append(frame_ms(app, panels[key], args.frames))
    print(
        f"{args.rounds} rounds × {args.frames} frames, interleaved; series: {len(model.names())}, "
        f"points per series: {HOUR_TICKS}"
    )
    print(f"{'variant':<12} {'window':>7} {'median ms':>10} {'min … max ms':>16} {'fps':>6} {'× app':>7}")
    for key in variants:
        med = statistics.median(results[key])
        base = statistics.median(results[("app", key[1])])
        spread = f"{min(results[key]):.1f} … {max(results[key]):.1f}"
        print(f"{key[0]:<12} {key[1]:>6}s {med:>10.1f} {spread:>16} {1e3 / med:>6.1f} {med / base:>7.2f}")
    for panel in panels.values():  # tear the plots down while Qt is alive, not at interpreter exit
        panel.shutdown()
        panel.deleteLater()
    panels.clear()
    app.processEvents()
    return 0


if __name__ == "__main__":
    sys.exit(main())
