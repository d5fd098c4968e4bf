"""Screenshots of the window at 1280x800 and 1600x1000 (issue 28): a three-turn chat whose stats
show the reused prefix, a trace with a finding selected on the timeline, a runs compare, and a
roofline with both roofs. Usage (offscreen, a scratch settings dir and store):

    PYTHONPATH=<folder holding opscope> python packaging/window_screenshots.py docs/screenshots
"""

import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
import numpy as np
from PySide6.QtWidgets import QApplication

app = QApplication([])
from app_testing import close_window, open_window, wait_until  # noqa: E402  (after the QApplication)
from opscope.app.window.screenshot import grab_window  # noqa: E402  (after the QApplication)

OUT = Path(sys.argv[1])
base = Path(tempfile.mkdtemp())
win = open_window(app, base)


def settle(s=0.5):
    end = time.monotonic() + s
    while time.monotonic() < end:
        app.processEvents()
        time.sleep(0.01)


def shot(name):
    settle()
    grab_window(win).save(str(OUT / name))
    print("wrote", name, flush=True)


# chat: three turns, the stats line shows what was reused
chat = win.chat
chat.sampling.temperature.setValue(0.7)
for i, text in enumerate(("Write a python function that sums a list.", "Now with numbers 12345.", "And explain it.")):
    chat.sampling.seed.setValue(i)
    chat.sampling.max_tokens.setValue(40)
    chat.input.setPlainText(text)
    done = []
    chat.session.replyFinished.connect(done.append)
    chat.send_button.click()
    wait_until(app, lambda done=done: done, 300, f"turn {i + 1}")
    chat.session.replyFinished.disconnect(done.append)
    print("turn", i + 1, {k: done[0].stats[k] for k in ("prompt_tokens", "cached_tokens", "ttft_ms")}, flush=True)
# runs: a baseline, a disturbed run, a bandwidth run and an llm-shaped run for the roofline
from opscope.engine.core.results import Metric, RunResult  # noqa: E402  (after the QApplication)
from opscope.engine.store import RunStore  # noqa: E402  (after the QApplication)

rng = np.random.default_rng(0)


def mm(name, scale, quality=None):
    return RunResult(
        kind="matmul",
        name=name,
        settings={"device": "cpu", "dtype": "float32"},
        metrics=[
            Metric(
                f"matmul_float32_{n}",
                "GFLOP/s",
                list(rng.normal(10 * scale * np.log2(n), 0.3, 10)),
                params={"n": n, "dtype": "float32"},
                quality=quality,
            )
            for n in (64, 128, 256, 512, 1024, 2048)
        ],
    )


with RunStore.open(win.db_url) as store:
    ids = [store.save(mm("matmul-baseline", 1.0)), store.save(mm("matmul-after-fix", 1.3, "disturbed"))]
    store.save(
        RunResult(
            kind="bandwidth",
            name="bandwidth-cpu",
            settings={"device": "cpu"},
            metrics=[Metric("copy_256MiB", "GB/s", [9.5, 10.2, 9.9])],
        )
    )
runs = win.panels["runs"]
# trace: the leaky-norm variant on a simulated accelerator, its first finding selected
trace = win.panels["trace"]
for size in ((1280, 800), (1600, 1000)):
    win.resize(*size)
    settle(1.0)
    tag = f"{size[0]}x{size[1]}"
    win.docks["chat"].raise_()
    shot(f"chat-{tag}.png")
    if trace.model.report is None:
        trace.variant.setCurrentText("leaky-norm")
        trace.target.setCurrentIndex(1)
        trace.tokens.setValue(4)
        trace.run_button.click()
        wait_until(app, lambda: trace.model.report is not None and not trace.model.busy, 300, "the trace")
    win.docks["trace"].raise_()
    settle()
    trace.findings.setCurrentRow(0)
    trace.table.selectRow(0)
    shot(f"trace-{tag}.png")
    win.docks["runs"].raise_()
    runs.refresh()
    runs.select_ids(ids)
    runs.compare_selected()
    shot(f"runs-compare-{tag}.png")
    runs.select_ids([ids[0]])
    runs.roofline_selected()
    wait_until(app, lambda: runs.roofline_view.roof is not None and runs.roofline_view._job is None, 120, "roofline")
    shot(f"roofline-{tag}.png")
close_window(win)
