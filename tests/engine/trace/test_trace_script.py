"""`opscope trace -- python SCRIPT`: real scripts, written to a temporary folder, traced in a subprocess.

Each script is tiny (a few steps of a 2-layer model) so the test pays mostly for starting Python.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SEPARATOR = "opscope trace:"


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def _line(path: Path, marker: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if marker in line)


def _opscope(args: list[str], cwd: Path, db: Path | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "opscope.engine.cli.main", "--db", str(db or cwd / "runs.sqlite"), *args]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300, env=env)


def _trace(
    tmp_path: Path, words: list[str], *extra: str, db: Path | None = None
) -> tuple[dict, subprocess.CompletedProcess]:
    report = tmp_path / "report.json"
    r = _opscope(["trace", "--report", str(report), *extra, "--", *words], tmp_path, db)
    assert report.is_file(), r.stdout[-2000:] + r.stderr[-3000:]
    return json.loads(report.read_text()), r


def _trace_here(tmp_path: Path, words: list[str], *extra: str, db: Path | None = None) -> tuple[dict, int]:
    """`_trace` without the subprocess, for the tests of what a trace finds (not of how the script
    runs: argv, exit codes, tracebacks, output keep _trace): the CLI's main() in this interpreter,
    from the script's folder. The runner restores sys.argv, sys.path and the working directory
    after the script (engine.trace.script._SysState); each script runs as a fresh __main__."""
    from opscope.engine.cli.main import main

    report, here = tmp_path / "report.json", os.getcwd()
    os.chdir(tmp_path)
    try:
        code = main(
            ["--db", str(db or tmp_path / "runs.sqlite"), "trace", "--report", str(report), *extra, "--", *words]
        )
    finally:
        os.chdir(here)
    assert report.is_file(), f"exit code {code}, no report"
    return json.loads(report.read_text()), code


TRAIN = """
import torch
from torch import nn

torch.manual_seed(0)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 16)
        self.b = nn.Linear(16, 1)
        self.c = nn.Linear(4, 1) if {with_c} else None

    def forward(self, x):
        h = torch.relu(self.a(x))  # CALL_A
        return self.b(h){extra}


model = Net()
opt = torch.optim.SGD({params}, lr={lr})
x = torch.randn(32, 4)
y = x.sum(1, keepdim=True)
for i in range(12):
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()  # BACKWARD
    opt.step()  # STEP
print("final", loss.item())
"""


def _train_script(
    tmp_path: Path, extra: str = "", params: str = "model.parameters()", lr: str = "0.1", forward: str | None = None
) -> Path:
    text = TRAIN.format(extra=extra, params=params, lr=lr, with_c="self.c" in extra)
    if forward is not None:
        text = text.replace("h = torch.relu(self.a(x))  # CALL_A", forward)
    return _write(tmp_path, "train.py", text)


def _kinds(report: dict) -> list[str]:
    return [f["kind"] for f in report["findings"]]


def test_healthy_loop_has_no_finding_and_one_sync_per_step(tmp_path):
    script = _write(
        tmp_path,
        "clean.py",
        """
        import torch
        from torch import nn
        import opscope

        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(32, 4)
        y = x.sum(1, keepdim=True)
        for i in range(10):
            opt.zero_grad()
            with opscope.region("forward"):
                loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            print(i, round(loss.item(), 3))  # ITEM: one read per step
            opscope.step()
        """,
    )
    report, r = _trace(tmp_path, ["python", script.name], "--target", "cpu")
    assert r.returncode == 0, r.stderr[-3000:]
    assert report["findings"] == [], report["findings"]
    assert report["unit"] == "step" and report["step_source"] == "opscope.step()"
    assert report["tokens"] == 10
    assert report["syncs_per_token"] == pytest.approx(1.0)
    assert any(f"clean.py:{_line(script, 'ITEM')}" in e for e in report["expected"])
    # opscope.step() and opscope.region() do nothing when the script runs alone: the same output
    alone = subprocess.run([sys.executable, script.name], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert alone.returncode == 0, alone.stderr
    assert r.stdout.split("\n\n" + "=" * 24)[0].strip() == alone.stdout.strip()


def test_per_element_loop_is_a_storm_at_its_line(tmp_path):
    script = _write(
        tmp_path,
        "storm.py",
        """
        import torch
        from opscope import step

        x = torch.randn(40)
        for s in range(3):
            out = torch.empty(40)
            for i in range(40):
                out[i] = x[i].item() * 2  # PER_ELEMENT
            step()
        """,
    )
    report, code = _trace_here(tmp_path, ["python", script.name], "--target", "cpu")
    assert code == 0
    storms = [f for f in report["findings"] if f["kind"] == "storm"]
    assert len(storms) == 1, report["findings"]
    assert storms[0]["sources"] == [f"storm.py:{_line(script, 'PER_ELEMENT')}"]
    assert storms[0]["evidence"]["max_per_step"] == 40


def test_a_model_built_on_the_host_then_moved_is_setup_not_a_fallback(tmp_path):
    """`Net().to(device)` initialises the weights on the CPU once, in step 0: the first GPU run of
    examples/fast_train.py reported it as a fallback (docs/gpu.md). The meta device stands in for
    the accelerator; a host op in every step is still a finding."""
    script = _write(
        tmp_path,
        "moved.py",
        """
        import torch
        from torch import nn
        import opscope

        model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1)).to("meta")  # BUILT
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(32, 4, device="meta")
        y = x.sum(1, keepdim=True)
        for i in range(6):
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opscope.step()
        """,
    )
    report, code = _trace_here(tmp_path, ["python", script.name], "--target", "meta")
    assert code == 0
    assert report["findings"] == [], report["findings"]
    built = f"moved.py:{_line(script, 'BUILT')}"
    assert (
        f"setup computed off meta in step 0 only, at {built} (empty, uniform_): once, not per step" in report["notes"]
    )
    assert "training health: not judged (no scalar loss with values reached backward())" in report["notes"]

    text = script.read_text().replace(
        "    opt.zero_grad()", "    scale = torch.tensor(2.0) * 1.5  # EVERY_STEP\n    opt.zero_grad()"
    )
    script.write_text(text.replace("loss = nn.functional", "loss = scale * nn.functional"))
    report, code = _trace_here(tmp_path, ["python", script.name], "--target", "meta")
    assert code == 0
    assert [(f["kind"], f["sources"]) for f in report["findings"]] == [
        ("fallback", [f"moved.py:{_line(script, 'EVERY_STEP')}"])
    ], report["findings"]


def test_loss_not_falling(tmp_path):
    script = _train_script(tmp_path, lr="0.0")
    report, _ = _trace_here(tmp_path, ["python", script.name], "--target", "cpu")
    assert _kinds(report) == ["loss"], report["findings"]
    assert report["findings"][0]["sources"] == [f"train.py:{_line(script, 'BACKWARD')}"]


def test_parameters_that_never_get_a_gradient(tmp_path):
    script = _train_script(tmp_path, forward="h = torch.relu(self.a(x)).detach()  # CALL_A")
    report, _ = _trace_here(tmp_path, ["python", script.name], "--target", "cpu")
    assert report["step_source"] == "optimizer.step()" and report["tokens"] == 11  # the first waits: see _Steps
    found = [f for f in report["findings"] if f["kind"] == "no_grad"]
    assert len(found) == 1, report["findings"]
    assert found[0]["modules"] == ["Net.a"]
    assert found[0]["sources"] == [f"train.py:{_line(script, 'CALL_A')}"]
    assert "Net.a.weight" in found[0]["title"] and "Net.b" not in found[0]["title"]


def test_optimizer_that_steps_parameters_not_in_the_model(tmp_path):
    script = _train_script(tmp_path, params="Net().parameters()")
    report, _ = _trace_here(tmp_path, ["python", script.name], "--target", "cpu")
    kinds = _kinds(report)
    assert "optimizer" in kinds and "loss" in kinds, report["findings"]
    opt = next(f for f in report["findings"] if f["kind"] == "optimizer")
    assert opt["sources"] == [f"train.py:{_line(script, 'STEP')}"] and "Net" in opt["modules"]


def test_gradients_all_zero_and_non_finite(tmp_path):
    extra = " + 0 * self.c(x)"  # c's gradient is exactly zero at every step
    script = _train_script(tmp_path, extra=extra)
    report, _ = _trace_here(tmp_path, ["python", script.name], "--target", "cpu")
    assert _kinds(report) == ["gradient"], report["findings"]
    assert report["findings"][0]["modules"] == ["Net.c"] and "all zero" in report["findings"][0]["title"]

    nan = " + 0 * torch.sqrt(self.c(x) - self.c(x).detach())"  # sqrt'(0) = inf: a NaN gradient in c
    script = _train_script(tmp_path, extra=nan)
    report, _ = _trace_here(tmp_path, ["python", script.name], "--target", "cpu")
    # the NaN reaches every parameter after the first step, and the loss after it: c is named as the first
    assert sorted(_kinds(report)) == ["gradient", "loss"], report["findings"]
    grad = next(f for f in report["findings"] if f["kind"] == "gradient")
    assert grad["modules"] == ["Net.c"] and "non-finite" in grad["title"]


def test_argv_exit_code_main_and_relative_paths_as_alone(tmp_path):
    _write(tmp_path, "pkg/helper.py", "VALUE = 'from the script folder'\n")
    _write(tmp_path, "data.txt", "read from the working directory\n")
    script = _write(
        tmp_path,
        "pkg/prog.py",
        """
        import os, sys
        import helper  # found through sys.path[0], the script's folder
        print("argv", sys.argv)
        print("name", __name__)
        print("helper", helper.VALUE)
        print("data", open("data.txt").read().strip())
        print("cwd", os.getcwd())
        sys.exit(3)
        """,
    )
    alone = subprocess.run(
        [sys.executable, "pkg/prog.py", "a", "--flag", "b"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert alone.returncode == 3, alone.stderr
    report, r = _trace(tmp_path, ["python", "pkg/prog.py", "a", "--flag", "b"], "--target", "cpu", "--no-save")
    assert r.returncode == 3, r.stderr[-2000:]
    assert r.stdout.split("\n\n" + "=" * 24)[0].strip() == alone.stdout.strip()
    assert "saved as run" not in r.stdout
    assert report["step_source"] == "whole run" and report["tokens"] == 0  # no step() and no optimizer
    assert str(script) not in alone.stdout  # argv[0] is as typed, relative


def test_module_mode_and_a_script_that_raises(tmp_path):
    _write(
        tmp_path,
        "mymod.py",
        """
        import sys
        import torch
        from opscope import step

        print("argv", sys.argv[1:], sys.argv[0].endswith("mymod.py"), __name__)
        x = torch.ones(3)
        for i in range(2):
            x = x * 2
            step()
        raise ValueError("boom")  # RAISE
        """,
    )
    report, r = _trace(tmp_path, ["python", "-m", "mymod", "x", "y"], "--target", "cpu")
    assert r.returncode == 1
    assert "argv ['x', 'y'] True __main__" in r.stdout
    assert "ValueError: boom" in r.stderr and f'mymod.py", line {_line(tmp_path / "mymod.py", "RAISE")}' in r.stderr
    assert "runpy" not in r.stderr and "engine/trace" not in r.stderr  # the traceback is the script's own
    assert report["exit_code"] == 1 and report["tokens"] == 2  # the trace up to the exception
    assert any("exit code 1" in n for n in report["notes"])


def test_saved_traces_are_runs_and_diff(tmp_path, capsys):
    db = tmp_path / "runs.sqlite"
    slow = _write(
        tmp_path,
        "slow.py",
        """
        import torch
        from opscope import step

        x = torch.randn(32)
        for s in range(4):
            y = torch.tensor([x[i].item() + 1 for i in range(32)])  # SLOW
            step()
        """,
    )
    fast = _write(
        tmp_path,
        "fast.py",
        """
        import torch
        from opscope import step

        x = torch.randn(32)
        for s in range(4):
            y = x + 1
            step()
        """,
    )
    _trace_here(tmp_path, ["python", slow.name], "--target", "cpu", "--name", "slow-run", "--telemetry", "20", db=db)
    _trace_here(tmp_path, ["python", fast.name], "--target", "cpu", "--name", "fast-run", db=db)
    from opscope.engine.store import RunStore

    with RunStore.open(str(db)) as store:
        run = store.get("slow-run")
    assert run.kind == "trace" and run.fingerprint["torch"] and len(run.metrics[0].samples) == 3
    assert {"host.cpu_pct", "proc.rss_bytes"} <= {t.name for t in run.telemetry}  # telemetry alongside
    steps = [(m.edge, m.attrs["index"]) for m in run.markers if m.phase == "step"]
    assert steps == [(edge, i) for i in range(5) for edge in ("start", "end")]  # 4 steps and the tail: phases
    from opscope.engine.cli.main import main

    def opscope(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(["--db", str(db), *args])
        out, err = capsys.readouterr()
        return code, out, err

    code, out, err = opscope("runs", "list", "--kind", "trace", "--format", "json")
    assert code == 0 and [r["name"] for r in json.loads(out)] == ["fast-run", "slow-run"], err
    code, out, err = opscope("trace", "diff", "slow-run", "fast-run", "--json")
    assert code == 0, err
    diff = json.loads(out)
    assert [f["kind"] for f in diff["only_in_a"]] == ["storm"] and diff["only_in_b"] == []
    assert diff["syncs_per_step"] == [32.0, 0.0]
    assert diff["ops_off_target"][0] >= 4 * 32 and diff["ops_off_target"][1] == 0
    text = opscope("trace", "diff", "slow-run", "fast-run")[1]
    assert "Findings only in A (fixed in B): 1" in text and f"slow.py:{_line(slow, 'SLOW')}" in text
