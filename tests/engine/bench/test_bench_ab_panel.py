"""The Benchmarks panel's A/B mode: a real offscreen panel, a real engine worker process (no model
loaded: matmul needs none), a tiny matmul with side B planted 2x slower (A runs the same planted loop
unslowed). The pair is measured
interleaved in one process, saved as two runs, and B against A is shown as `runs compare` says it."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest

pytestmark = [pytest.mark.gui, pytest.mark.usefixtures("one_torch_thread")]

B_FLAGS = "--param planted_slowdown=2 --threads 1"


@pytest.fixture
def panel(qtbot, tmp_path, monkeypatch):
    from opscope.app.bench.model import BenchModel
    from opscope.app.bench.panel import BenchPanel
    from opscope.app.ui.engine_client import EngineClient
    from opscope.app.worker.bench import suite_catalog

    # The worker's torch defaults to one thread per core; side A (no --threads) would then run two
    # OpenMP threads on a shared 2-core host, 10-20x slower when a peer is descheduled, and bury
    # the 2x plant (CI, stop 43: A 14.91, B 15.79 GFLOP/s). One thread on both sides, as B says.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    client = EngineClient()
    panel = BenchPanel(BenchModel(client, f"sqlite:///{tmp_path / 'runs.db'}"))
    qtbot.addWidget(panel)
    panel.set_suites(suite_catalog())
    panel.resize(1100, 700)
    panel.show()
    qtbot.waitExposed(panel)
    yield panel
    client.shutdown()


def test_an_a_b_run_from_the_panel_shows_b_against_a_interleaved(qtbot, panel):
    from opscope.engine.store import RunStore

    panel.suite_combo.setCurrentText("matmul")
    panel.quick.setChecked(True)
    panel.params.editors["sizes"].setText("32")
    panel.params.editors["dtypes"].setText("float32")
    # A runs the planted loop unslowed (round(10 x 1.001) = 10 calls): both sides time the same code shape
    panel.params.editors["planted_slowdown"].setValue(1.001)
    panel.name_edit.setText("pair")
    assert not panel.ab_flags.isEnabled()
    panel.ab_check.setChecked(True)
    panel.ab_flags.setText("--no-such-flag 3")  # said in the panel, in one line; nothing runs
    with qtbot.waitSignal(panel.model.failed, timeout=120_000):
        panel.run_button.click()
    assert "A/B flags '--no-such-flag 3': unrecognized arguments: --no-such-flag 3" in panel.status.text()
    panel.ab_flags.setText(B_FLAGS)
    with qtbot.waitSignal(panel.model.finished, timeout=300_000) as blocker:
        panel.run_button.click()
    result = blocker.args[0]
    assert result["status"] == "completed", result
    qtbot.waitUntil(lambda: not panel.model.busy, timeout=10_000)
    assert panel.tabs.currentWidget() is panel.ab_view  # the roofline of B does not take its place
    text = panel.ab_view.toPlainText()
    assert "interleaved: 'pair-a' and 'pair-b' were measured in one process" in text, text
    row = next(line for line in text.splitlines() if line.startswith("matmul_float32_32 "))
    assert "%" in row and "(p=0.0" in row and not row.rstrip().endswith("~"), row  # the 2x plant is flagged
    names = [panel.table.item(r, 0).text() for r in range(panel.table.rowCount())]
    assert "matmul_float32_32 [A]" in names and "matmul_float32_32 [B]" in names
    assert "A/B saved as runs “pair-a / pair-b”" in panel.status.text()
    a_id, b_id = result["run_ids"]
    with RunStore.open(panel.model.db_url) as store:
        b = store.load(b_id).result
        assert store.load(a_id).result.settings["interleaved"]["pair"] == ["pair-a", "pair-b"]
    assert b.settings["interleaved"]["b_flags"] == B_FLAGS and b.settings["suite_params"]["planted_slowdown"] == 2.0
