"""Issue 28: the trace timeline is something to work with, not a picture: hover shows an op, a
click on a bar selects its table row and a table row or a finding outlines its ops on the timeline,
a drag zooms to the dragged span, lanes show their ops apart, and the headline cards agree.

The trace is a real one: `opscope trace` on a small CPU script (its report and JSON lines)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from PySide6.QtCore import QEvent, QPoint, QPointF, Qt
from PySide6.QtGui import QMouseEvent
from PySide6.QtWidgets import QApplication, QToolTip

pytestmark = [pytest.mark.gui]

SCRIPT = """
import torch
from opscope import step

x = torch.randn(64, 64)
for s in range(3):
    y = (x @ x).relu().pow(2).sum(dim=0)
    v = torch.tensor([y[i].item() for i in range(16)])  # PER_ELEMENT
    step()
"""


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    """The report and op columns of a real CPU-only script trace (what the script dialog hands over)."""
    from opscope.app.trace.script_job import read_columns

    folder = tmp_path_factory.mktemp("trace")
    (folder / "s.py").write_text(textwrap.dedent(SCRIPT))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "opscope.engine.cli.main",
            "--db",
            str(folder / "runs.sqlite"),
            "trace",
            "--target",
            "cpu",
            "--report",
            str(folder / "r.json"),
            "--jsonl",
            str(folder / "ops.jsonl"),
            "--out",
            str(folder / "t.json"),
            "--",
            sys.executable,
            "s.py",
        ],
        cwd=folder,
        env=env,
        check=True,
        capture_output=True,
        timeout=300,
    )
    return {
        "report": json.loads((folder / "r.json").read_text()),
        "columns": read_columns(folder / "ops.jsonl"),
        "exit_code": 0,
        "perfetto_path": str(folder / "t.json"),
    }


@pytest.fixture
def panel(qtbot, traced):
    from opscope.app.trace.model import TraceModel
    from opscope.app.trace.panel import TracePanel
    from opscope.app.ui.engine_client import EngineClient

    panel = TracePanel(TraceModel(EngineClient()))  # never started: the script trace is already made
    qtbot.addWidget(panel)
    panel.resize(1280, 760)
    panel.show()
    qtbot.waitExposed(panel)
    panel.show_script_report(traced)
    return panel


def _pixel(timeline, x: float, y: float) -> QPoint:
    """Where data point (x s, lane y) is drawn, in the timeline's viewport."""
    scene = timeline.getPlotItem().getViewBox().mapViewToScene(QPointF(x, y))
    return timeline.mapFromScene(scene)


def _bar_centre(timeline, row: int) -> QPoint:
    c = timeline.columns
    mid = (float(c["t_us"][row]) + max(float(c["dur_us"][row]), 0.05) / 2) / 1e6
    return _pixel(timeline, mid, float(timeline.lanes.index(timeline._lane_of(row))))


def _widest_on_target(timeline) -> int:
    c = timeline.columns
    on = np.flatnonzero(c["kind"] == "on_target")
    return int(on[np.argmax(c["dur_us"][on])])


def test_the_cards_of_a_cpu_only_script_agree(panel, traced):
    """It read "64.3 % ops on target" in red beside "0 fallback ops": syncs and host bookkeeping
    were counted as ops off target."""
    assert traced["report"]["ops_on_target_pct"] < 100  # the syncs of .item() are in the report's share
    assert panel.cards["fallbacks"].value.text() == "0"
    assert panel.cards["on_target"].value.text() == "100.0%"
    assert panel.cards["on_target"].title.text() == "compute ops on target"
    assert panel.cards["on_target"].property("severity") == "good"
    assert panel.cards["time_on_target"].value.text() == "100.0%"


def test_hovering_a_bar_shows_its_op(qtbot, panel):
    """Moving onto a bar shows its op in a tooltip; a quick movement that ends off every bar hides
    it. pyqtgraph's scene drops a move that comes within 10 ms of the one before (its mouse rate
    limit), so the last position of a quick movement was lost and the tooltip stayed on an op the
    mouse had left (or never came for a bar reached by a quick movement)."""
    timeline = panel.timeline
    row = _widest_on_target(timeline)
    op = str(timeline.columns["op"][row]).removeprefix("aten.")
    on_bar, off = _bar_centre(timeline, row), QPoint(timeline.viewport().width() - 2, 2)  # off every bar
    for pos in (off, on_bar + QPoint(0, 2), on_bar):  # a quick movement ending on the bar
        qtbot.mouseMove(timeline.viewport(), pos)
    qtbot.waitUntil(lambda: QToolTip.isVisible())
    assert QToolTip.text().startswith(f"{op}  (on_target on cpu)\nstart ")
    assert " · duration " in QToolTip.text().splitlines()[1]
    for pos in (on_bar + QPoint(0, 2), off):  # and one ending off every bar
        qtbot.mouseMove(timeline.viewport(), pos)
    qtbot.waitUntil(lambda: not QToolTip.isVisible())
    assert timeline.hover_text == ""


def test_a_table_row_and_a_bar_select_each_other(qtbot, panel):
    timeline, ops = panel.timeline, panel.model.ops
    panel.table.selectRow(5)
    assert timeline.selected.tolist() == [int(ops.rows[5])]
    row = _widest_on_target(timeline)
    qtbot.mouseClick(timeline.viewport(), Qt.LeftButton, pos=_bar_centre(timeline, row))
    assert timeline.selected.tolist() == [row]
    current = panel.table.currentIndex().row()
    assert int(ops.rows[current]) == row and panel.table.selectionModel().isRowSelected(current)
    assert ops.data(ops.index(current, 1)) == str(timeline.columns["op"][row]).removeprefix("aten.")


def test_a_finding_outlines_its_ops_on_the_timeline(panel):
    storm = next(i for i, f in enumerate(panel.model.report["findings"]) if f["kind"] == "storm")
    panel.findings.setCurrentRow(storm)
    shown = panel.model.ops.rows
    assert 0 < len(shown) < panel.model.ops.total
    assert panel.timeline.selected.tolist() == shown.tolist()
    assert all(panel.timeline.columns["source"][r].startswith("s.py:") for r in shown)


def test_a_drag_zooms_to_the_dragged_span_and_keeps_the_lanes(qtbot, panel):
    timeline = panel.timeline
    (x0, x1), (y0, y1) = timeline.getPlotItem().getViewBox().viewRange()
    a, b = x0 + 0.3 * (x1 - x0), x0 + 0.4 * (x1 - x0)
    start, end = _pixel(timeline, a, 0), _pixel(timeline, b, 0)
    viewport = timeline.viewport()
    for kind, pos, buttons in (
        (QEvent.MouseButtonPress, start, Qt.LeftButton),
        (QEvent.MouseMove, start + QPoint(10, 0), Qt.LeftButton),
        (QEvent.MouseMove, end, Qt.LeftButton),
        (QEvent.MouseButtonRelease, end, Qt.NoButton),
    ):
        QApplication.sendEvent(
            viewport,
            QMouseEvent(kind, QPointF(pos), QPointF(viewport.mapToGlobal(pos)), Qt.LeftButton, buttons, Qt.NoModifier),
        )
        qtbot.wait(1)
    (z0, z1), (w0, w1) = timeline.getPlotItem().getViewBox().viewRange()
    assert z0 == pytest.approx(a, abs=(x1 - x0) * 0.01) and z1 == pytest.approx(b, abs=(x1 - x0) * 0.01)
    assert (w0, w1) == pytest.approx((y0, y1))


def test_an_unzoomed_lane_shows_its_ops_apart(panel):
    """Every lane was one solid bar in the device colour: ops are coloured by name now."""
    timeline = panel.timeline
    image = timeline.grab().toImage()
    y = _pixel(timeline, 0, float(timeline.lanes.index("cpu"))).y()
    left = _pixel(timeline, 0, 0).x()
    right = _pixel(timeline, timeline.visible_span()[1], 0).x()
    background = image.pixelColor(left + 2, 4).name()
    colours = {image.pixelColor(x, y).name() for x in range(max(left, 0), min(right, image.width()))}
    assert len(colours - {background}) >= 3


@pytest.mark.parametrize("width", [790, 845], ids=["1280x800", "1400x900"])
def test_the_op_table_shows_whole_names(qtbot, panel, width):
    """The Trace dock of a 1280x800 window is ~790 px wide (845 px at 1400x900): op names read
    "pow.Tenso…", "#" "…" past row 99. The findings go above the table there, and short columns fit
    every value."""
    from opscope.app.trace.ops_model import COLUMNS

    panel.resize(width, 690)
    qtbot.waitUntil(lambda: panel._narrow)
    table, ops = panel.table, panel.model.ops
    metrics = table.fontMetrics()
    col = {key: i for i, (key, _h, _f) in enumerate(COLUMNS)}
    last = ops.rowCount() - 1
    table.scrollToBottom()  # the highest seq: three digits
    qtbot.wait(20)
    for key in ("seq", "op", "kind", "device"):
        widest = max(metrics.horizontalAdvance(str(ops.data(ops.index(r, col[key])))) for r in (0, last))
        assert widest + 8 <= table.columnWidth(col[key]), key
    shown = [
        r
        for r in range(ops.rowCount())
        if 0 <= table.rowViewportPosition(r)
        and table.rowViewportPosition(r) + table.rowHeight(r) <= table.viewport().height()
    ]
    assert len(shown) >= 6
