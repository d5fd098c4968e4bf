"""Issue 30: the window's Trace tab traces a model loaded on the MLX backend through the backend's
own op hook (as `opscope trace --backend mlx`): the op table, the cards and the timeline show the
MLX ops with their stream, shapes and host times. One window with the embedded model on MLX."""

from __future__ import annotations

import json
import os
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest

pytest.importorskip("mlx.core")
pytestmark = [pytest.mark.gui, pytest.mark.slow]


@pytest.fixture(scope="module")
def window(qapp, tmp_path_factory):
    from app_testing import close_window, open_window

    win = open_window(qapp, tmp_path_factory.mktemp("gui-mlx"), backend="mlx")
    yield win
    close_window(win)


@pytest.fixture(scope="module")
def panel(window):
    panel = window.panels["trace"]
    window.docks["trace"].raise_()
    panel.prompt.setText("Hi")
    panel.tokens.setValue(2)
    return panel


def _trace(qtbot, panel):
    panel.run_button.click()  # finished or failed: a failure's line is then the status text asserted
    qtbot.waitUntil(lambda: not panel.model.busy, timeout=300_000)


def _col(key: str) -> int:
    from opscope.app.trace.ops_model import COLUMNS

    return next(i for i, (k, _h, _f) in enumerate(COLUMNS) if k == key)


def _cell(panel, row: int, key: str) -> str:
    """The text the op table shows in ``row`` under the column ``key``."""
    return panel.table.model().index(row, _col(key)).data()


def _hidden(panel) -> set[str]:
    from opscope.app.trace.ops_model import COLUMNS

    return {k for i, (k, _h, _f) in enumerate(COLUMNS) if panel.table.isColumnHidden(i)}


def test_the_trace_tab_shows_the_mlx_ops(qtbot, window, panel, tmp_path):
    assert window.client.model_info["backend"] == "mlx"
    _trace(qtbot, panel)
    ops = panel.model.ops
    (stream,) = ops.distinct("device")  # one MLX stream: the loaded device's
    assert stream.startswith("Stream(Device(")
    assert panel.status.text() == f"mlx backend on {stream}: {ops.total:,} ops, 2 tokens, 1.0 host syncs per token."
    assert ops.rowCount() == ops.total == panel.model.result["ops"] > 100
    assert panel.count_label.text() == f"{ops.total:,} of {ops.total:,} ops"
    names = [_cell(panel, r, "op") for r in range(ops.rowCount())]
    qmm = names.index("quantized_matmul")  # the 4-bit projections, as mlx.nn calls them
    assert _cell(panel, qmm, "device") == stream and _cell(panel, qmm, "kind") == "op"
    assert _cell(panel, qmm, "shapes").startswith("1x") and float(_cell(panel, qmm, "dur_us")) >= 0
    sync = names.index("array.item")  # the host waits for the token here: MLX computes lazily
    assert _cell(panel, sync, "kind") == "sync" and float(_cell(panel, sync, "dur_us")) > 0
    assert panel.timeline.lanes == [stream, "sync"]
    assert _hidden(panel) == {"direction", "module", "source", "step", "t_us", "shapes"}  # no empty columns
    width = panel.table.columnWidth(_col("op"))
    assert width > panel.table.fontMetrics().horizontalAdvance("array.getitem")  # was cut to "array.g…"
    assert panel.device_filter.itemText(1) == stream and panel.kind_filter.itemText(2) == "sync"
    out = json.loads(Path(panel.model.export_perfetto(str(tmp_path / "mlx.json"))).read_text())
    assert {"quantized_matmul", "array.item", "token"} <= {e["name"] for e in out["traceEvents"]}


def test_the_cards_and_findings_speak_of_the_mlx_op_stream(qtbot, panel):
    if panel.model.report is None:
        _trace(qtbot, panel)
    cards = {key: (card.title.text(), card.value.text()) for key, card in panel.cards.items()}
    ops = panel.model.ops.total
    assert cards["on_target"] == ("ops / token", f"{ops / 2:,.0f}")
    assert cards["fallbacks"] == ("devices / streams", "1")
    assert cards["syncs"] == ("syncs / token", "1.0")
    assert cards["time_on_target"][0] == "host time in syncs" and cards["time_on_target"][1].endswith("%")
    assert cards["storms"][0] == "distinct ops" and int(cards["storms"][1]) >= 10
    assert panel.findings.count() == 1
    assert panel.findings.item(0).text().startswith("No placement findings on the mlx backend:")
    detail = panel.finding_detail.toPlainText()
    assert "Ops by host time" in detail and "quantized_matmul" in detail and "array.item" in detail
    said = detail + panel.status.toolTip()
    assert "fallback to the CPU" not in said and "simulated accelerator" not in said  # torch's hints


def test_options_the_mlx_backend_cannot_honour_are_refused_in_one_line(qtbot, panel):
    panel.variant.setCurrentText("leaky-norm")
    try:
        with qtbot.waitSignal(panel.model.failed, timeout=60_000):
            panel.run_button.click()
    finally:
        panel.variant.setCurrentText("clean")
    assert panel.status.text() == (
        "trace failed: the mlx backend traces its own ops: planted variants and the simulated "
        "accelerator trace torch ops; choose variant 'clean' and target 'as loaded', or load the model on torch"
    )
    assert panel.run_button.isEnabled()


def test_a_torch_trace_after_the_mlx_one_gets_its_cards_and_columns_back(qtbot, panel):
    from opscope.app.trace.model import TraceModel
    from opscope.app.trace.ops_model import HIDDEN_BY_DEFAULT
    from opscope.app.trace.panel import CARD_TITLES, TracePanel

    if panel.model.report is None:
        _trace(qtbot, panel)
    other = TracePanel(TraceModel(client=None))
    qtbot.addWidget(other)
    other.model.result = {"variant": "clean", "simulated": False}
    other.show_report(panel.model.report)
    assert other.cards["fallbacks"].title.text() == "devices / streams" and "module" in _hidden(other)
    torch_report = {
        "target": "cpu",
        "ops": 4,
        "tokens": 2,
        "findings": [],
        "notes": [],
        "by_kind": {"on_target": {"count": 4, "ms": 1.0}},
        "transfers": [],
        "syncs_per_token": 0.5,
    }
    other.show_report(torch_report)
    assert [(k, other.cards[k].title.text()) for k, _t in CARD_TITLES] == list(CARD_TITLES)
    assert other.cards["fallbacks"].value.text() == "0" and other.cards["on_target"].value.text() == "100.0%"
    assert _hidden(other) == set(HIDDEN_BY_DEFAULT)
    assert other.status.text() == "clean model on cpu: 4 ops, 2 tokens; 0 finding(s)."
