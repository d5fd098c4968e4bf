"""--quick is a time budget the runner keeps (issue 31 item 8): past it, points stop adding
repetitions, and the run says so (printed, in its notes and settings). A budget of 0 s makes every
point's share spent at once, so what is asserted does not depend on this machine's speed."""

from __future__ import annotations

import dataclasses
import re

import pytest
from opscope.engine.bench.measure import options, runner
from opscope.engine.cli.main import main
from opscope.engine.store import RunStore

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TINY = ["--param", "sizes=16,32,48", "--param", "dtypes=float32"]
LINE = re.compile(
    r"quick: time budget 0 s kept \(run took \d+ s\): 3 of 3 points stopped adding repetitions at "
    r"1\+ \(full rule: 5\); fewer samples, wider CIs; drop --quick for full runs"
)


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("OPSCOPE_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def spent(monkeypatch):
    monkeypatch.setattr(options, "QUICK", dataclasses.replace(runner.QUICK, budget_s=0.0))


def test_help_says_what_quick_is(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "matmul", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "tiny sizes and a 60 s time budget the runner keeps" in text and "stops adding repetitions" in text
    assert runner.QUICK.budget_s == 60.0


def test_a_spent_budget_stops_repetitions_and_says_so(tmp_path, capsys, spent):
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    assert main(["--db", db, "bench", "matmul", "--quick", *TINY, "--name", "q"]) == 0
    out = capsys.readouterr().out
    assert LINE.search(" ".join(out.split()))
    with RunStore.open(db) as store:
        run = store.load("q").result
    timed = [m for m in run.metrics if m.name.startswith("matmul_") and m.unit == "GFLOP/s"]
    assert len(timed) == 3 and all(len(m.samples) == 1 for m in timed)  # quick's rule alone asks 5
    assert LINE.fullmatch(run.notes)
    assert run.settings["runner"]["budget_s"] == 0.0


def test_a_b_runs_share_the_budget(tmp_path, capsys, spent):
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    assert main(["--db", db, "bench", "matmul", "--quick", *TINY, "--name", "p", "--ab", "--threads 1"]) in (0, 1)
    with RunStore.open(db) as store:
        runs = [store.load(r.id).result for r in store.list()]
    assert len(runs) == 2
    for run in runs:
        timed = [m for m in run.metrics if m.name.startswith("matmul_") and m.unit == "GFLOP/s"]
        assert len(timed) == 3 and all(len(m.samples) == 1 for m in timed)
        assert LINE.fullmatch(run.notes)
