"""What the Benchmarks panel shows a person: every suite parameter under a human label with its
unit and a tooltip (the suite's own ``param`` description), byte sizes as "64 MiB", roofline ticks in
engineering units, and a collectives run started from the window with a moving progress bar and
every rank's markers saved as `opscope bench collectives --nproc` saves them."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import re
import threading

import pytest

pytestmark = pytest.mark.gui


@pytest.fixture
def panel(qtbot):
    from opscope.app.bench.model import BenchModel
    from opscope.app.bench.panel import BenchPanel
    from opscope.app.worker.bench import suite_catalog

    panel = BenchPanel(BenchModel(client=None, db_url=None))
    qtbot.addWidget(panel)
    panel.set_suites(suite_catalog())
    return panel


def _rows(panel) -> dict[str, tuple[str, str, str]]:
    """{field: (label text, label tooltip, editor tooltip)} as the form shows them."""
    form = panel.params
    out = {}
    for f in form.fields:
        editor = form.editors[f["name"]]
        label = form.form.labelForField(editor)
        out[f["name"]] = (label.text(), label.toolTip(), editor.toolTip())
    return out


def test_every_suite_parameter_has_a_human_label_unit_and_tooltip(panel):
    import dataclasses

    from opscope.engine.bench.suites import get_suite

    for suite in panel.suites:
        panel.suite_combo.setCurrentText(suite)
        rows = _rows(panel)
        fields = {f.name: f for f in dataclasses.fields(get_suite(suite).Params)}
        assert list(rows) == list(fields), suite
        for name, (label, label_tip, editor_tip) in rows.items():
            assert "doc" in fields[name].metadata, f"{suite}.{name} is not declared with param(...)"
            assert label != name and "_" not in label and label[0].isupper(), (suite, name, label)
            assert len(label_tip) > 20 and f"--param {name}=" in label_tip, (suite, name, label_tip)
            assert editor_tip.startswith(label_tip.split("\n")[0]), (suite, name, editor_tip)
    panel.suite_combo.setCurrentText("matmul")
    rows = _rows(panel)
    assert rows["call_budget_s"][0] == "Call budget (s)"
    assert rows["sizes"][0] == "Matrix sizes (n×n)" and rows["dtypes"][0] == "Data types"
    assert rows["call_budget_s"][1] == (
        "Skip a size whose single call is predicted (from the smaller sizes) to "
        "take longer than this.\n(--param call_budget_s=…)"
    )
    assert panel.params.editors["call_budget_s"].text() == "0.500"  # no unit repeated after the number


def test_byte_sizes_read_and_parse_as_binary_units(panel):
    from opscope.app.bench.param_units import parse_size

    panel.suite_combo.setCurrentText("bandwidth")
    editor = panel.params.editors["sizes_bytes"]
    assert _rows(panel)["sizes_bytes"][0] == "Copy sizes (bytes)" and editor.text() == "64 MiB"
    assert panel.params.values() == {"sizes_bytes": [64 * 2**20]}
    editor.setText("1 GiB, 512KiB, 4096")
    assert panel.params.values() == {"sizes_bytes": [2**30, 512 * 2**10, 4096]}
    panel.suite_combo.setCurrentText("collectives")
    assert panel.params.editors["sizes_bytes"].text() == "8 B, 1 KiB, 64 KiB"
    assert _rows(panel)["sizes_bytes"][0] == "Message sizes (bytes)"
    with pytest.raises(ValueError):
        parse_size("1.3 B")


def test_tick_labels_use_engineering_units():
    from opscope.app.ui.widgets import engineering, engineering_log_axis

    assert engineering(3e11, "FLOP/s") == "300 GFLOP/s" and engineering(1e12, "FLOP/s") == "1 TFLOP/s"
    assert engineering(4.8e10, "B/s") == "48 GB/s" and engineering(2.5e15, "FLOP/s") == "2.5 PFLOP/s"
    assert [engineering(v) for v in (0.1, 1, 10, 1000)] == ["0.1", "1", "10", "1,000"]
    axis = engineering_log_axis("left", "FLOP/s")
    axis.setLogMode(False, True)
    assert axis.tickStrings([9.0, 11.0, 12.0], 1.0, 1.0) == ["1 GFLOP/s", "100 GFLOP/s", "1 TFLOP/s"]


def test_a_collectives_run_from_the_window_shows_progress_and_saves_every_ranks_markers(qtbot, tmp_path):
    """The panel's request through the worker's bench job (real gloo ranks); the job's messages
    drive a real panel's progress bar, and the run holds the same per-rank markers as the CLI's."""
    from opscope.app.bench.model import BenchModel
    from opscope.app.bench.panel import BenchPanel
    from opscope.app.worker.bench import run_bench
    from opscope.app.worker.protocol import BenchRequest
    from opscope.engine.store import RunStore

    db = f"sqlite:///{tmp_path / 'runs.db'}"
    req = BenchRequest(
        suite="collectives",
        quick=True,
        name="win",
        db_url=db,
        params={"nproc": 2, "sizes_bytes": [8], "collectives": ["all_gather"], "reps": 2},
    )
    sent = []
    out = run_bench(None, None, req, lambda kind, **msg: sent.append(msg), threading.Event())
    assert out["status"] == "completed"

    panel = BenchPanel(BenchModel(client=None, db_url=db))
    qtbot.addWidget(panel)
    panel.model.started.emit("collectives")
    seen = []
    for msg in sent:
        panel.model._on_progress(msg)  # what the client's Job.progress delivers
        seen.append((panel.progress.value(), panel.progress.text()))
    texts = [text for _v, text in seen]
    assert "0 / 2 points" in texts, texts  # the sweep's points (in place, out of place), before the ranks run
    assert seen[-1][0] == 1000 and texts[-1].startswith("2 / 2 points"), seen
    assert panel.status.text() == "running collectives… measuring"
    units = {panel.table.item(r, 0).text(): panel.table.item(r, 4).text() for r in range(panel.table.rowCount())}
    assert units["all_gather_8B_ip"] == "GB/s" and units["all_gather_8B_ip.time"] == "µs", units
    with RunStore.open(db) as store:
        markers = store.load(out["run_id"]).result.markers
    ranks = [m for m in markers if m.phase == "collective"]
    # 2 points (in place, out of place) x 2 reps x 2 ranks, a start and an end each
    assert len(ranks) == 16 and {m.attrs["rank"] for m in ranks} == {0, 1}
    assert {m.attrs["name"] for m in ranks} == {"all_gather in_place", "all_gather out_of_place"}
    assert all(re.fullmatch(r"start|end", m.edge) for m in ranks)
