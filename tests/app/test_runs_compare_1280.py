"""Issue 28: a compare read at 1280x800 showed two rows under a nine-line header, unexplained
footnote marks, Δ cells cut to "dist…" and a disturbed run's +30 % in green like a result."""

from __future__ import annotations

import numpy as np
import pytest
from opscope.engine.core.results import Metric, RunResult

pytestmark = [pytest.mark.gui]


def _run(name: str, scale: float, quality: str | None = None) -> RunResult:
    rng = np.random.default_rng(int(scale * 10))
    metrics = [
        Metric(
            f"matmul_float32_{n}",
            "GFLOP/s",
            list(rng.normal(10 * scale * np.log2(n), 0.3, 10)),
            params={"n": n, "dtype": "float32"},
            quality=quality,
        )
        for n in (64, 128, 256, 512, 1024, 2048)
    ]
    return RunResult(kind="matmul", name=name, metrics=metrics, settings={"device": "cpu", "dtype": "float32"})


@pytest.fixture
def compared(qtbot, tmp_path):
    """The Runs panel as the window holds it at 1280x800, comparing a baseline with a disturbed run."""
    from opscope.app.runs.model import RunsModel
    from opscope.app.runs.panel import RunsPanel
    from opscope.engine.store import RunStore

    url = f"sqlite:///{tmp_path / 'runs.db'}"
    with RunStore.open(url) as store:
        ids = [store.save(_run("matmul-baseline", 1.0)), store.save(_run("matmul-after-fix", 1.3, "disturbed"))]
    model = RunsModel(url)
    panel = RunsPanel(model)
    qtbot.addWidget(panel)
    panel.resize(1260, 700)  # the Runs dock inside a 1280x800 window
    panel.show()
    qtbot.waitExposed(panel)
    panel.refresh()
    panel.select_ids(ids)
    panel.compare_selected()
    qtbot.wait(50)
    yield panel.compare_view
    model.close()


def test_the_compare_table_shows_its_rows_under_a_short_header(compared):
    view = compared
    table = view.table
    lines = view.header.height() / view.header.fontMetrics().lineSpacing()
    assert lines < 3.5  # two lines, not a wall of text
    shown = [
        r
        for r in range(table.rowCount())
        if table.rowViewportPosition(r) + table.rowHeight(r) <= table.viewport().height()
    ]
    assert len(shown) >= 5
    assert view.distributions.height() >= 140  # a readable plot under them


def test_marks_are_explained_and_disturbed_changes_are_not_shown_as_results(compared):
    from opscope.app.runs.views import BETTER, DISTURBED

    view = compared
    table = view.table
    header = view.header.text()
    assert "¹ few samples" in header and "² noisy" in header and "³ disturbed" in header
    delta_col = table.columnCount() - 1
    for r in range(table.rowCount()):
        item = table.item(r, delta_col)
        assert item.text().endswith("%³") and len(item.text()) <= 8  # "+30.1%³": short, never "dist…"
        assert table.fontMetrics().horizontalAdvance(item.text()) + 12 <= table.columnWidth(delta_col)
        assert item.foreground().color() == DISTURBED != BETTER and item.font().italic()
        assert "disturbed: matmul-after-fix" in item.toolTip() and "p=" in item.toolTip()


def test_the_runs_list_at_1280x800_shows_every_column_title_whole(qtbot, tmp_path):
    """In the Xvfb walk's 1280x800 window the list read "am" for "name" and scrolled sideways: a
    model file name two lines high took the width, and the stretched name column got what was left."""
    from opscope.app.runs.model import RunsModel
    from opscope.app.runs.panel import COLUMNS, RunsPanel
    from opscope.engine.store import RunStore

    url = f"sqlite:///{tmp_path / 'runs.db'}"
    long = _run("matmul-baseline-with-a-long-name", 1.0)
    long.settings["model"] = "/models/SmolLM2-135M-Instruct.Q4_1.gguf"
    with RunStore.open(url) as store:
        store.save(long)
        store.save(_run("matmul-after-fix", 1.3, "disturbed"))
    model = RunsModel(url)
    panel = RunsPanel(model)
    qtbot.addWidget(panel)
    panel.resize(760, 700)  # the Runs dock of a 1280x800 window beside the telemetry dock
    panel.show()
    qtbot.waitExposed(panel)
    panel.refresh()
    qtbot.wait(20)
    table, header = panel.table, panel.table.horizontalHeader()
    metrics = header.fontMetrics()
    for c, title in enumerate(COLUMNS):
        assert metrics.horizontalAdvance(title) + 8 <= header.sectionSize(c), title
    assert header.length() <= table.viewport().width()  # no sideways scrolling
    assert not table.horizontalScrollBar().isVisible()
    model.close()
