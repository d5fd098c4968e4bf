"""Trace panel → "Trace a script…": the dialog runs a real script in a child process, streams its
output, hands the report over, and diffs two saved traces."""

from __future__ import annotations

import os
import textwrap

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest

pytestmark = [pytest.mark.gui]

SLOW = """
import torch
from opscope import step

x = torch.randn(32)
for s in range(3):
    y = torch.tensor([x[i].item() for i in range(32)])  # PER_ELEMENT
    print("step", s, flush=True)
    step()
"""
FAST = SLOW.replace("torch.tensor([x[i].item() for i in range(32)])", "x.clone()")


def _run(qtbot, dialog, script) -> dict:
    dialog.script.setText(str(script))
    dialog.cwd.setText(str(script.parent))
    dialog.target.setCurrentIndex(dialog.target.findData("cpu"))
    with qtbot.waitSignal(dialog.report_ready, timeout=180_000) as blocker:
        dialog.run()
    return blocker.args[0]


def test_trace_a_script_from_the_window_and_diff(qtbot, tmp_path):
    from opscope.app.trace.model import TraceModel
    from opscope.app.trace.panel import TracePanel
    from opscope.app.ui.engine_client import EngineClient

    (tmp_path / "slow.py").write_text(textwrap.dedent(SLOW))
    (tmp_path / "fast.py").write_text(textwrap.dedent(FAST))
    line = next(i for i, t in enumerate(SLOW.splitlines(), 1) if "PER_ELEMENT" in t)
    where = f"slow.py:{line}"
    panel = TracePanel(TraceModel(EngineClient()))  # the engine worker is not started: the script has its own
    qtbot.addWidget(panel)
    dialog = panel.open_script_dialog()
    dialog.db_url = str(tmp_path / "runs.sqlite")
    slow = _run(qtbot, dialog, tmp_path / "slow.py")
    # the panel shows the script's report and ops, as for the model
    assert panel.findings.count() == len(slow["report"]["findings"]) >= 1
    assert panel.model.ops.total == slow["report"]["stored_events"]
    assert "3 steps" in panel.status.text() and panel.export_button.isEnabled()
    assert slow["exit_code"] == 0 and slow["run_name"]
    assert "step 2" in dialog.output.toPlainText()  # the script's output, streamed into the dialog
    storm = [f for f in slow["report"]["findings"] if f["kind"] == "storm"]
    assert storm and storm[0]["sources"] == [where]
    assert len(slow["columns"]["seq"]) == slow["report"]["stored_events"] > 0
    assert where in slow["columns"]["source"]

    fast = _run(qtbot, dialog, tmp_path / "fast.py")
    assert fast["report"]["findings"] == []
    assert dialog.compare_with.findData(slow["run_name"]) >= 0 and dialog.diff_button.isEnabled()
    text = dialog.diff_text(slow["run_name"])
    assert "Findings only in A (fixed in B): 1" in text and where in text
