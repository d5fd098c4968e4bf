"""The Telemetry panel on real widgets (offscreen) over a real Sampler with the real host source.

GPUs are not on this machine: where a test needs one it uses a Source that reports the same
series names and units NvmlSource reports (gpu0.util_pct, gpu0.mem_used_bytes, ...)."""

from __future__ import annotations

import csv
import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import numpy as np
import pytest
from opscope.app.telemetry.model import TelemetryModel
from opscope.app.telemetry.panel import TelemetryPanel
from opscope.app.telemetry.source import EngineProcessSource
from opscope.engine.core.clock import now_ns
from opscope.engine.telemetry import Source
from opscope.engine.telemetry.host import HostSource

pytestmark = pytest.mark.gui


class FakeGpuSource(Source):
    """Stands in for NvmlSource on a machine with one NVIDIA GPU: same series names and units."""

    name = "nvml"

    def _open(self):
        self._ready(
            {
                "gpu0.util_pct": "%",
                "gpu0.mem_used_bytes": "bytes",
                "gpu0.mem_total_bytes": "bytes",
                "gpu0.power_w": "W",
                "gpu0.power_limit_w": "W",
                "gpu0.temp_c": "C",
                "gpu0.sm_clock_mhz": "MHz",
                "gpu0.mem_clock_mhz": "MHz",
            }
        )
        self.k = 0

    def _sample(self):
        self.k += 1
        return {
            "gpu0.util_pct": float(self.k % 100),
            "gpu0.mem_used_bytes": 2.0 * 2**30,
            "gpu0.mem_total_bytes": 16.0 * 2**30,
            "gpu0.power_w": 120.0,
            "gpu0.power_limit_w": 300.0,
            "gpu0.temp_c": 60.0,
            "gpu0.sm_clock_mhz": 1800.0,
            "gpu0.mem_clock_mhz": 9000.0,
        }


class NoGpuSource(Source):
    """What NvmlSource says on this machine (no driver)."""

    name = "nvml"

    def _open(self):
        self._unavailable("no NVIDIA GPU (NVML: NVML Shared Library Not Found)")


def _panel(qtbot, sources, interval_ms=20.0):
    model = TelemetryModel(None, interval_ms=interval_ms, history_s=60, sources=sources)
    model.start()
    panel = TelemetryPanel(model, refresh_ms=30)
    qtbot.addWidget(panel)
    panel.resize(800, 900)
    panel.show()
    return model, panel


@pytest.fixture
def host_panel(qtbot):
    engine = EngineProcessSource()
    model, panel = _panel(qtbot, [HostSource(), NoGpuSource(), engine])
    engine.set_pid(os.getpid())  # stands in for the worker: any live process will do
    yield model, panel
    panel.shutdown()


def _points(panel, name):
    xs, _ys = panel.curves[name].getOriginalDataset()
    return 0 if xs is None else len(xs)


def test_host_plots_receive_samples(qtbot, host_panel):
    model, panel = host_panel
    qtbot.waitUntil(lambda: "host.cpu_pct" in panel.curves and _points(panel, "host.cpu_pct") >= 5, timeout=10_000)
    qtbot.waitUntil(
        lambda: "engine.rss_bytes" in panel.curves and _points(panel, "engine.rss_bytes") >= 2, timeout=10_000
    )
    _xs, ys = panel.curves["engine.rss_bytes"].getOriginalDataset()
    assert 0.001 < np.nanmax(ys) < 1024  # plotted in GiB, this process's RSS


def test_without_a_gpu_the_panel_says_why_and_draws_no_gpu_plot(qtbot, host_panel):
    _model, panel = host_panel
    qtbot.waitUntil(lambda: panel.gpu_note.isVisible(), timeout=10_000)
    assert "no NVIDIA GPU" in panel.gpu_note.text() and "Host plots stay live" in panel.gpu_note.text()
    assert not any(key.startswith("gpu") for key in panel.plots)


def test_gpu_plots_appear_per_gpu_series(qtbot):
    model, panel = _panel(qtbot, [HostSource(), FakeGpuSource()])
    try:
        qtbot.waitUntil(
            lambda: "gpu0.util_pct" in panel.curves and _points(panel, "gpu0.util_pct") >= 3, timeout=10_000
        )
        assert {"gpu_util", "gpu_mem", "gpu_power", "gpu_temp", "gpu_clock"} <= set(panel.plots)
        assert not panel.gpu_note.isVisible()
        _xs, ys = panel.curves["gpu0.mem_total_bytes"].getOriginalDataset()
        assert ys[-1] == pytest.approx(16.0)  # bytes shown in GiB
    finally:
        panel.shutdown()


def test_phase_markers_become_bands_on_every_plot(qtbot, host_panel):
    model, panel = host_panel
    t = now_ns()
    model.on_marker({"phase": "prefill", "edge": "start", "t_ns": t - 2_000_000_000, "attrs": {}})
    model.on_marker({"phase": "prefill", "edge": "end", "t_ns": t - 1_500_000_000, "attrs": {}})
    model.on_marker({"phase": "decode", "edge": "start", "t_ns": t - 1_500_000_000, "attrs": {}})
    panel.refresh(force=True)
    for key in panel.plots:
        assert [b[0] for b in panel.bands[key].bands] == ["decode", "prefill"], key
    (_, lo, hi), _prefill = panel.bands["cpu"].bands
    assert hi == pytest.approx(0.0, abs=0.5) and hi - lo >= 1.4  # still open: it runs up to now
    assert panel.bands["cpu"].phases_at(-1.7) == ["prefill"]
    assert "[decode]" in panel.readout_at(-1.0)
    model.on_marker({"phase": "decode", "edge": "end", "t_ns": t - 1_000_000_000, "attrs": {}})
    panel.refresh(force=True)
    (_, lo, hi), _prefill = panel.bands["cpu"].bands
    assert hi - lo == pytest.approx(0.5, abs=1e-6)
    panel.grab()  # the bands paint


def test_window_selector_pause_and_crosshair(qtbot, host_panel):
    model, panel = host_panel
    qtbot.waitUntil(lambda: "host.cpu_pct" in panel.curves and _points(panel, "host.cpu_pct") >= 5, timeout=10_000)
    panel.window_combo.setCurrentIndex(0)
    assert panel.window_s == 30
    (x0, x1), _ = panel.plots["cpu"].vb.viewRange()
    assert x1 - x0 == pytest.approx(30, rel=0.02)
    panel.pause_button.click()
    frozen = _points(panel, "host.cpu_pct")
    count = panel.refresh_count
    qtbot.waitUntil(lambda: model.sampler.ticks > 5 + frozen, timeout=10_000)
    assert panel.refresh_count == count and _points(panel, "host.cpu_pct") == frozen
    panel.pause_button.click()
    assert _points(panel, "host.cpu_pct") > frozen  # resuming catches up: nothing was lost
    xs, _ = panel.curves["host.cpu_pct"].getOriginalDataset()
    text = panel.readout_at(float(xs[-1]))
    assert " s ago" in text and "host CPU" in text


def test_export_png_and_csv(qtbot, host_panel, tmp_path):
    model, panel = host_panel
    qtbot.waitUntil(
        lambda: _points(panel, "host.cpu_pct") >= 3 if "host.cpu_pct" in panel.curves else False, timeout=10_000
    )
    model.on_marker({"phase": "decode", "edge": "start", "t_ns": now_ns(), "attrs": {}})
    assert panel.export_png(str(tmp_path / "t.png")) and (tmp_path / "t.png").stat().st_size > 1000
    rows = panel.export_csv(str(tmp_path / "t.csv"))
    with open(tmp_path / "t.csv", newline="") as f:
        table = list(csv.reader(f))
    assert rows == len(table) - 1 >= 3
    assert "host.cpu_pct [%]" in table[0] and "engine.rss_bytes [bytes]" in table[0]
    assert any(row[-1] == "decode:start" for row in table[1:])


def test_an_hour_of_10hz_history_is_clipped_to_the_view(qtbot):
    """36,000 samples per series: what is drawn is bounded by the view, not by the history."""
    model = TelemetryModel(None, interval_ms=100, history_s=3600, sources=[])  # not started: we feed it
    t_end = now_ns()
    for k in range(36_000):
        model.sampler.history.append(t_end - (36_000 - k) * 100_000_000, {"host.cpu_pct": float(k % 100)})
    panel = TelemetryPanel(model, refresh_ms=10_000)
    qtbot.addWidget(panel)
    panel.resize(800, 600)
    panel.show()
    panel.window_combo.setCurrentIndex(panel.window_combo.count() - 1)  # 1 h
    assert _points(panel, "host.cpu_pct") > 35_900  # a few fell out of the window as time moved
    panel.grab()  # paints with peak downsampling: the displayed set is a few points per pixel
    xs, _ = panel.curves["host.cpu_pct"].getData()
    assert xs is not None and len(xs) < 10_000
    panel.window_combo.setCurrentIndex(0)  # 30 s: only the last 300 samples are even read
    assert _points(panel, "host.cpu_pct") <= 301
    panel.timer.stop()


def _fake_nvml(monkeypatch, procs=()):
    from fake_nvml import FakeGpu, FakeNvml

    gpus = [
        FakeGpu("NVIDIA H100 80GB HBM3", procs=procs),
        FakeGpu("NVIDIA H100 80GB HBM3", unsupported=("nvmlDeviceGetPcieThroughput",)),
    ]
    return FakeNvml(gpus).install(monkeypatch)


def test_pcie_and_throttle_reasons_are_plotted_where_nvml_reports_them(qtbot, monkeypatch):
    pytest.importorskip("pynvml")
    from opscope.engine.telemetry.nvml import NvmlSource

    _fake_nvml(monkeypatch)
    model, panel = _panel(qtbot, [NvmlSource()])
    try:
        qtbot.waitUntil(
            lambda: "gpu0.pcie_tx_bytes_s" in panel.curves and _points(panel, "gpu0.pcie_tx_bytes_s") >= 2,
            timeout=10_000,
        )
        assert {"gpu_pcie", "gpu_reasons"} <= set(panel.plots)
        title = panel.plots["gpu_pcie"].titleLabel.text
        assert title.startswith("<b>PCIe throughput</b> (MiB/s)") and "gpu0 TX (to host)" in title
        xs, ys = panel.curves["gpu0.pcie_rx_bytes_s"].getOriginalDataset()
        assert ys[-1] == pytest.approx(2000 / 1024)  # NVML's 2000 KB/s in MiB/s
        assert "gpu1.pcie_tx_bytes_s" not in panel.curves  # gpu1's NVML does not report PCIe
        qtbot.waitUntil(lambda: "gpu0.clock_event_reasons#sw_pwr" in panel.curves, timeout=10_000)
        panel.refresh(force=True)
        _x, lane = panel.curves["gpu0.clock_event_reasons#sw_pwr"].getOriginalDataset()
        _x, other = panel.curves["gpu0.clock_event_reasons#hw_therm"].getOriginalDataset()
        assert lane[-1] == 2.0 and np.isnan(other).all()  # the sw_pwr lane is the third one, hw_therm is off
        ticks = panel.plots["gpu_reasons"].getAxis("left")._tickLevels[0]
        assert (2, "sw_pwr") in ticks
        text = panel.readout_at(float(xs[-1]))
        assert "gpu0 sw_pwr active" in text and "gpu0 RX (to GPU) 1.95 MiB/s" in text
    finally:
        panel.shutdown()


def test_vram_of_the_engine_worker_not_of_the_gui(qtbot, monkeypatch):
    """The per-process VRAM line sums the engine worker's pid (a real worker process)."""
    pytest.importorskip("pynvml")
    from opscope.app.ui.engine_client import EngineClient
    from opscope.app.worker.protocol import PingRequest
    from opscope.engine.telemetry.nvml import NvmlSource

    fake = _fake_nvml(monkeypatch)
    client = EngineClient()
    nvml = NvmlSource()
    model = TelemetryModel(client, interval_ms=20, history_s=60, sources=[nvml, EngineProcessSource()])
    try:
        with qtbot.waitSignal(client.workerStarted, timeout=60_000):
            client.submit(PingRequest())
        assert client.pid and client.pid != os.getpid()
        assert nvml.pids == {client.pid}
        fake.gpus[0].procs = ((os.getpid(), 100 * 2**20), (client.pid, 300 * 2**20))
        model.start()
        panel = TelemetryPanel(model, refresh_ms=30)
        qtbot.addWidget(panel)
        panel.show()
        qtbot.waitUntil(
            lambda: "gpu0.proc_mem_bytes" in panel.curves and _points(panel, "gpu0.proc_mem_bytes") >= 2, timeout=10_000
        )
        _xs, ys = panel.curves["gpu0.proc_mem_bytes"].getOriginalDataset()
        assert ys[-1] == pytest.approx(300 / 1024)  # GiB: the worker's 300 MiB, not the GUI's 100
        assert panel.curves["gpu0.proc_mem_bytes"].name() == "gpu0 engine process"
        panel.shutdown()
    finally:
        model.stop()
        client.shutdown()


def test_the_crosshair_and_readout_clear_when_the_mouse_leaves(qtbot, host_panel):
    """Issue 28: the hover readout and crosshair stayed frozen after the mouse left the plots."""
    from opscope.app.telemetry.panel import READOUT_HINT
    from PySide6.QtCore import QEvent
    from PySide6.QtWidgets import QApplication

    model, panel = host_panel
    qtbot.waitUntil(lambda: "host.cpu_pct" in panel.curves and _points(panel, "host.cpu_pct") >= 5, timeout=10_000)
    plot = panel.plots["cpu"]
    centre = panel.graphics.mapFromScene(plot.sceneBoundingRect().center())
    qtbot.mouseMove(panel.graphics.viewport(), centre)
    qtbot.waitUntil(lambda: "host CPU" in panel.readout.text())
    assert all(c.isVisible() for c in panel.cursors)
    qtbot.mouseMove(panel.window_combo)  # the mouse leaves the plots for the controls
    QApplication.sendEvent(panel.graphics.viewport(), QEvent(QEvent.Leave))  # what Qt sends as it goes
    assert panel.readout.text() == READOUT_HINT
    assert not any(c.isVisible() for c in panel.cursors)


def test_an_idle_engine_redraws_the_plots_once_a_second(qtbot):
    """Issue 28: an idle window took ~11 % of a core redrawing every plot ten times a second."""
    from opscope.app.telemetry.panel import IDLE_REFRESH_MS
    from opscope.app.ui.engine_client import EngineClient

    client = EngineClient()  # never started: the test says what state it reports
    model = TelemetryModel(client, interval_ms=50, history_s=60, sources=[HostSource()])
    panel = TelemetryPanel(model, refresh_ms=100)
    qtbot.addWidget(panel)
    try:
        assert panel.timer.interval() == IDLE_REFRESH_MS == 1000
        client.stateChanged.emit("busy")
        assert panel.timer.interval() == 100
        client.stateChanged.emit("idle")
        assert panel.timer.interval() == IDLE_REFRESH_MS
    finally:
        panel.shutdown()
