"""Trace → "Trace a script…" → Diagnose: the script's diagnosis, run in its own process, shows in the
dialog with its top finding and the line the step waits on."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest

pytestmark = [pytest.mark.gui, pytest.mark.slow]

LOADER = """import time

import torch
from torch import nn

import opscope

model = nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(6):
    rows = []
    for _ in range(20):
        time.sleep(0.001)  # LOADER
        rows.append([0.1] * 8)
    loss = (model(torch.tensor(rows)) - 1.0).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    opscope.step()
"""


def test_diagnose_a_script_from_the_dialog_shows_the_input_pipeline_line(qtbot, tmp_path):
    from opscope.app.trace.script_dialog import ScriptTraceDialog

    (tmp_path / "loader.py").write_text(LOADER)
    dialog = ScriptTraceDialog(f"sqlite:///{tmp_path / 'runs.db'}")
    qtbot.addWidget(dialog)
    dialog.show()
    dialog.script.setText("loader.py")
    dialog.cwd.setText(str(tmp_path))
    dialog.target.setCurrentIndex(dialog.target.findData("cpu"))
    with qtbot.waitSignal(dialog.job.diagnosed, timeout=240_000):
        dialog.diagnose_button.click()
    line = next(i for i, text in enumerate(LOADER.splitlines(), 1) if "LOADER" in text)
    shown = dialog.output.toPlainText().splitlines()
    top = next(text for text in shown if text.startswith("1. "))
    assert top.startswith("1. [medium] input pipeline: no op runs for ")
    assert f"while the host runs loader.py:{line} (" in top
    assert dialog.status.text().startswith("diagnose loader.py on cpu: step ")
    assert any(text.startswith("saved as run 1 (diagnosis-") for text in shown)
    assert dialog.diagnose_button.isEnabled() and dialog.run_button.isEnabled()
