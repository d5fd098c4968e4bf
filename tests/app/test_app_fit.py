"""Nothing scrolls sideways at 1400x900 and nothing is cut: the status bar's message beside a long
engine state, long code lines in a chat reply, and the Benchmarks, Run and Trace op tables (their
columns fit the view; long names elide with the whole text on hover). Units on bench parameters."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from datetime import UTC

import pytest

pytestmark = pytest.mark.gui


def _all_columns_in_view(table) -> bool:
    cols = [c for c in range(table.model().columnCount()) if not table.isColumnHidden(c)]
    right = max(table.columnViewportPosition(c) + table.columnWidth(c) for c in cols)
    return right <= table.viewport().width() and table.horizontalScrollBar().maximum() == 0


def test_the_status_message_shows_whole_beside_a_crashed_engine(qtbot):
    from opscope.app.ui.engine_client import EngineClient
    from opscope.app.ui.status import STATE_TEXT, EngineStatusBar
    from PySide6.QtWidgets import QMainWindow

    window, client = QMainWindow(), EngineClient()
    bar = EngineStatusBar(client, window)
    window.setStatusBar(bar)
    qtbot.addWidget(window)
    window.resize(1400, 900)
    window.show()
    qtbot.waitExposed(window)
    client.stateChanged.emit("crashed")
    bar.on_model_loaded(
        {
            "device": "cpu",
            "dtype": "bfloat16",
            "fastpath": "on (prefill_dtype=bf16)",
            "backend": "torch",
            "path": "/models/SmolLM2-135M-Instruct.Q4_1.gguf",
        }
    )
    bar.on_memory({"rss_bytes": 1.1 * 2**30, "weights_bytes": 92 * 2**20})
    message = "Could not load Qwen2.5-Coder-7B-Instruct-Q4_K_M.gguf"
    bar.showMessage(message)
    labels = (bar.state_label, bar.device_label, bar.model_label, bar.memory_label)
    qtbot.waitUntil(lambda: all(label.geometry().right() <= bar.width() for label in labels))
    first = min(label.geometry().left() for label in labels)
    assert bar.fontMetrics().horizontalAdvance(message) + 6 <= first  # Qt paints it left of the labels
    assert bar.state_label.text() == STATE_TEXT["crashed"]
    assert bar.model_label.full_text == "model: SmolLM2-135M-Instruct.Q4_1.gguf"
    bar.clearMessage()  # the message gone, the labels show whole again
    qtbot.waitUntil(lambda: not bar.model_label.is_elided() and not bar.device_label.is_elided())
    assert bar.model_label.text() == "model: SmolLM2-135M-Instruct.Q4_1.gguf"


def test_a_long_code_line_wraps_inside_its_block_not_the_whole_chat(qtbot):
    from opscope.app.chat.panel import ChatPanel
    from opscope.app.chat.session import ChatSession, Turn

    panel = ChatPanel(ChatSession(client=None))
    qtbot.addWidget(panel)
    panel.resize(845, 780)  # the Chat dock at 1400x900
    long_line = "result = " + " + ".join(f"compute_value_{i}(x)" for i in range(30))
    url = "https://example.com/" + "a" * 200
    panel.session.history = [
        Turn("user", "write it"),
        Turn("assistant", f"Here:\n\n```python\n{long_line}\n```\n\nSee {url}", {}, "eos"),
    ]
    panel.render()
    panel.show()
    qtbot.waitExposed(panel)
    transcript = panel.transcript
    qtbot.waitUntil(lambda: transcript.document().size().width() <= transcript.viewport().width() + 1)
    assert transcript.horizontalScrollBar().maximum() == 0
    doc = transcript.document()
    code = doc.findBlock(doc.toPlainText().index("result ="))
    assert code.text() == long_line and code.layout().lineCount() > 1  # wrapped, all of it kept
    assert code.charFormat().fontFixedPitch() or code.begin().fragment().charFormat().fontFixedPitch()
    assert code.blockFormat().background().style() != 0  # still a tinted code block


def _bench_points(panel) -> None:
    panel._on_started("matmul")
    for i, dtype in enumerate(("float32", "bfloat16", "float16")):
        for n in (128, 256):
            panel._on_point(
                {
                    "name": f"matmul_{dtype}_{n}",
                    "unit": "GFLOP/s",
                    "samples": [100.0 + i, 120.5 + i, 140.25 + i],
                    "params": {"dtype": dtype, "n": n, "call_budget_s": 0.5, "planted_slowdown": 1.0},
                    "status": "ok" if i else "failed",
                    "error": "RuntimeError: out of memory",
                }
            )


def test_benchmark_table_fits_its_columns_with_names_whole_on_hover(qtbot):
    from opscope.app.bench.model import BenchModel
    from opscope.app.bench.panel import BenchPanel

    panel = BenchPanel(BenchModel(client=None, db_url=None))
    qtbot.addWidget(panel)
    panel.resize(845, 740)  # the Benchmarks dock at 1400x900
    panel.show()
    qtbot.waitExposed(panel)
    _bench_points(panel)
    table = panel.table
    qtbot.waitUntil(lambda: _all_columns_in_view(table))
    median = table.item(0, 2)
    assert median.text().endswith("GFLOP/s")
    width = table.fontMetrics().horizontalAdvance(median.text())
    assert width <= table.columnWidth(2)  # the numbers are never the ones elided
    params = table.item(0, 1)
    assert table.fontMetrics().horizontalAdvance(params.text()) > table.columnWidth(1)
    assert params.toolTip() == params.text()  # the elided params whole on hover


def test_run_detail_fits_the_runs_dock(qtbot):
    from datetime import datetime

    from opscope.app.runs.views import RunDetailView
    from opscope.engine.core.results import Metric, RunResult
    from opscope.engine.store.convert import RunInfo, StoredRun

    view = RunDetailView()
    qtbot.addWidget(view)
    view.resize(820, 600)  # the Runs dock's detail at 1400x900
    view.show()
    metrics = [
        Metric(name=f"matmul_{d}_{n}", unit="GFLOP/s", samples=[150.0, 165.4, 189.7], params={"dtype": d, "n": n})
        for d in ("float32", "bfloat16")
        for n in (128, 256)
    ]
    info = RunInfo(
        id=1,
        name="matmul-20261124",
        kind="matmul",
        status="completed",
        tags=(),
        notes="",
        created_at=datetime(2026, 11, 24, tzinfo=UTC),
        finished_at=None,
        error=None,
        metric_count=len(metrics),
    )
    view.show_run(StoredRun(info, RunResult(kind="matmul", name=info.name, metrics=metrics)))
    qtbot.waitExposed(view.metrics)
    qtbot.waitUntil(lambda: _all_columns_in_view(view.metrics))
    headers = [view.metrics.horizontalHeaderItem(c).text() for c in range(view.metrics.columnCount())]
    assert "unit" in headers and view.metrics.item(0, headers.index("unit")).text() == "GFLOP/s"


def test_trace_op_table_fits_the_panel_and_a_row_tells_every_field(qtbot):
    from opscope.app.trace.model import TraceModel
    from opscope.app.trace.ops_model import COLUMNS
    from opscope.app.trace.panel import TracePanel
    from opscope.app.ui.tables import MIN_ELASTIC_PX
    from PySide6.QtCore import Qt

    panel = TracePanel(TraceModel(client=None))
    qtbot.addWidget(panel)
    panel.resize(845, 790)  # the Trace dock at 1400x900
    panel.show()
    qtbot.waitExposed(panel)
    n = 40
    ops = {
        "seq": list(range(n)),
        "op": ["aten._scaled_dot_product_flash_attention_for_cpu.default"] * n,
        "kind": ["fallback"] * n,
        "direction": ["D2H"] * n,
        "device": ["cpu"] * n,
        "module": ["model.layers.12.self_attn.q_proj.weight_quantizer"] * n,
        "source": ["engine/models/transformer.py:212"] * n,
        "step": [0] * n,
        "t_us": [float(i) for i in range(n)],
        "dur_us": [1234.5] * n,
        "bytes": [2_359_296] * n,
        "shapes": ["[1, 9, 512, 64], [1, 3, 512, 64]"] * n,
    }
    panel.model.ops.add_batch(ops)
    panel.model.ops.commit()
    panel.model.result = {"variant": "leaky-norm"}
    panel.show_report(
        {
            "target": "meta",
            "ops": n,
            "tokens": 2,
            "findings": [],
            "notes": [],
            "by_kind": {},
            "transfers": [],
            "ops_on_target_pct": 0.0,
            "time_on_target_pct": 0.0,
            "syncs_per_token": 0.0,
        }
    )
    table = panel.table
    qtbot.waitUntil(lambda: _all_columns_in_view(table))
    shown = [key for i, (key, _h, _f) in enumerate(COLUMNS) if not table.isColumnHidden(i)]
    assert {"op", "kind", "device", "module", "dur_us", "bytes"} <= set(shown)
    tip = table.model().data(table.model().index(0, 1), Qt.ToolTipRole)
    assert "engine/models/transformer.py:212" in tip and "[1, 9, 512, 64]" in tip and "2,359,296 B" in tip
    hidden = [i for i, (key, _h, _f) in enumerate(COLUMNS) if key == "source"][0]
    source_action = next(a for a in table.horizontalHeader().actions() if a.text() == COLUMNS[hidden][1])
    source_action.setChecked(True)  # the header's context menu shows a hidden column again
    assert not table.isColumnHidden(hidden) and table.columnWidth(hidden) >= MIN_ELASTIC_PX


def test_bench_parameters_show_their_units(qtbot):
    from opscope.app.bench.model import BenchModel
    from opscope.app.bench.panel import BenchPanel
    from opscope.app.worker.bench import suite_catalog

    panel = BenchPanel(BenchModel(client=None, db_url=None))
    qtbot.addWidget(panel)
    panel.set_suites(suite_catalog())
    panel.suite_combo.setCurrentText("llm")
    form = panel.params
    labels = {f["name"]: form.form.labelForField(form.editors[f["name"]]).text() for f in form.fields}
    assert labels["pp"] == "Prompt length (tokens)" and form.editors["pp"].text() == "64"  # the unit once
    assert labels["tg"] == "Generation length (tokens)"
    panel.suite_combo.setCurrentText("matmul")
    form = panel.params
    assert form.form.labelForField(form.editors["call_budget_s"]).text() == "Call budget (s)"


def test_roofline_names_never_overlap_and_the_caption_is_one_readable_line(qtbot):
    import pyqtgraph as pg
    from opscope.app.runs.roofline import RooflineView
    from opscope.engine.bench.ceilings.roofline import Ceiling, Roofline, RoofPoint

    # What the walk's quick matmul run drew: two long names 0.3 decades apart, nearly level.
    pts = [
        RoofPoint(name=n, suite="matmul", intensity=i, flop_s=f)
        for n, i, f in [
            ("matmul_float32_128", 21.3, 1.9e11),
            ("matmul_float32_256", 42.7, 1.65e11),
            ("matmul_float16_128", 42.7, 1.9e9),
        ]
    ]
    roof = Roofline(
        run="r",
        kind="matmul",
        device="cpu",
        dtype="float32",
        points=pts,
        ceilings=[
            Ceiling(
                kind="compute", basis="theoretical", value=588.8e9, label="588.8 GFLOP/s", origin="stored with the run"
            )
        ],
    )
    view = RooflineView()
    qtbot.addWidget(view)
    view.resize(530, 500)  # the Roofline tab at 1400x900
    view.show()
    qtbot.waitExposed(view)
    view._draw(roof)
    labels = [i for i in view.plot.getPlotItem().items if isinstance(i, pg.TextItem)]
    names = sorted(i.toPlainText() for i in labels)
    # every name placed in a free corner of its point (one only where no corner is free), none over
    # another; the prefix all names share ("matmul_") is said once, in the key, not on every point
    assert names == ["float16_128", "float32_128", "float32_256"]
    rects = [i.sceneBoundingRect() for i in labels]
    assert not any(a.intersects(b) for k, a in enumerate(rects) for b in rects[k + 1 :]), rects
    caption = view.summary.text()
    assert caption.startswith("compute ceiling: theoretical 588.8 GFLOP/s (stored with the run)")
    assert "achieved" not in caption and "---" not in caption  # no piece of the text table's header


def test_a_load_that_waits_for_the_kernel_build_keeps_saying_so(tmp_path, monkeypatch):
    """The GUI kills a load silent for 300 s; a first start compiling the CPU kernels is not hung."""
    import time

    from opscope.app.worker.jobs import kernel_build_heartbeat

    monkeypatch.setenv("OPSCOPE_KERNEL_CACHE", str(tmp_path))  # no library built here yet
    sent = []
    with kernel_build_heartbeat(lambda kind, **fields: sent.append((kind, fields)), every_s=0.05):
        time.sleep(0.4)
    assert len(sent) >= 3 and sent[0][0] == "progress" and sent[0][1]["stage"] == "building the CPU kernels"
    count = len(sent)
    time.sleep(0.2)
    assert len(sent) == count  # it stops with the load


def test_the_status_bar_states_the_mlx_conversion(qtbot):
    from opscope.app.ui.engine_client import EngineClient
    from opscope.app.ui.status import EngineStatusBar

    bar = EngineStatusBar(EngineClient())
    qtbot.addWidget(bar)
    bar.on_model_loaded(
        {
            "device": "cpu",
            "dtype": "float32",
            "backend": "mlx",
            "path": "/m/q.gguf",
            "conversion": "Q4_K → MLX 4-bit g32: exact; Q6_K → MLX 8-bit g32: requantized",
        }
    )
    assert bar.device_label.full_text == (
        "device: cpu · float32 · mlx · Q4_K → MLX 4-bit g32: exact; Q6_K → MLX 8-bit g32: requantized"
    )
