"""Issue 28 item 9: the Benchmarks panel says how long Run will take before it is pressed, from the
suite's points and repetitions, and from the last run of the same suite on this machine when the run
store has one; without one it says that the figure is a guess."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gui


@pytest.fixture
def db(tmp_path):
    return str(tmp_path / "runs.sqlite")


def _panel(qtbot, db):
    from opscope.app.bench.model import BenchModel
    from opscope.app.bench.panel import BenchPanel
    from opscope.app.worker.bench import suite_catalog

    panel = BenchPanel(BenchModel(client=None, db_url=db))
    qtbot.addWidget(panel)
    panel.set_suites(suite_catalog())
    panel.resize(1280, 760)
    panel.show()
    qtbot.waitExposed(panel)
    return panel


def _shown_whole(label) -> bool:
    """The label is beside Run and tall enough for its wrapped lines."""
    return label.isVisible() and label.height() >= label.heightForWidth(label.width())


def _bandwidth_run(db) -> tuple[float, int]:
    """A real quick bandwidth run (one 64 MiB point) saved in the store: its stored duration, its id."""
    from opscope.engine import BenchOptions, RunStore, run_suite

    with RunStore.open(db) as store:
        run_id, _ = run_suite("bandwidth", BenchOptions(quick=True, threads=1), store)
        return store.info(run_id).duration_s, run_id


def test_with_no_history_the_estimate_is_a_guess_that_follows_the_form(qtbot, db):
    panel = _panel(qtbot, db)
    panel.suite_combo.setCurrentText("matmul")
    assert panel.estimate.text() == "about 10 s for 6 points (a guess: no earlier matmul run on this machine)"
    qtbot.waitUntil(lambda: _shown_whole(panel.estimate))
    assert panel.run_button.geometry().right() < panel.estimate.geometry().left()  # beside Run
    panel.params.editors["sizes"].setText("128, 256, 512, 1024")
    assert panel.estimate.text() == "about 25 s for 12 points (a guess: no earlier matmul run on this machine)"
    panel.quick.setChecked(False)  # full runs: the defaults, and a second of repetitions a point
    assert panel.estimate.text() == "about 1 min for 21 points (a guess: no earlier matmul run on this machine)"
    panel.params.editors["sizes"].setText("128, x")  # not a number: Run will say so, no estimate
    assert panel.estimate.text() == ""


def test_the_last_run_of_the_suite_here_scales_the_estimate(qtbot, db):
    from opscope.engine import duration_text

    took, _id = _bandwidth_run(db)
    panel = _panel(qtbot, db)
    panel.suite_combo.setCurrentText("bandwidth")
    assert panel.estimate.text() == (
        f"{duration_text(took)} for 1 point (the last bandwidth run here took {took:.0f} s for 1 point)"
    )
    panel.params.editors["sizes_bytes"].setText("64 MiB, 128 MiB, 256 MiB")
    assert panel.estimate.text() == (
        f"{duration_text(3 * took)} for 3 points (the last bandwidth run here took {took:.0f} s for 1 point)"
    )
    qtbot.waitUntil(lambda: _shown_whole(panel.estimate))  # laid out again for the longer text
    panel.quick.setChecked(False)  # a full run is not a quick one: no history for it
    assert panel.estimate.text().endswith("(a guess: no earlier bandwidth run on this machine)")


def test_a_finished_run_becomes_the_history(qtbot, db):
    panel = _panel(qtbot, db)
    panel.suite_combo.setCurrentText("bandwidth")
    assert panel.estimate.text().endswith("(a guess: no earlier bandwidth run on this machine)")
    panel.model.started.emit("bandwidth")
    took, run_id = _bandwidth_run(db)  # as the worker saves it; then the model hears that it finished
    panel.model._on_finished({"run_id": run_id, "name": "b", "status": "completed", "error": None, "metrics": 1})
    assert panel.estimate.text().endswith(f"(the last bandwidth run here took {took:.0f} s for 1 point)")
