"""crossover (issue 14 item 7): the one-device message for real on this CPU-only machine, and the
crossover rule on recorded timings (from a CPU/H100 sweep's shape: small sizes lose to the launch
and transfer cost, large ones win)."""

from __future__ import annotations

import pytest
from opscope.engine.bench.measure.runner import Point, PointOutcome
from opscope.engine.bench.suites import crossover
from opscope.engine.cli.main import main
from opscope.engine.core.results import Metric


def test_one_device_machine_says_so_in_one_line_and_what_it_would_compare(capsys, tmp_path):
    import torch

    if torch.cuda.is_available() or torch.backends.mps.is_available():
        pytest.skip("this machine has an accelerator: the suite runs here instead")
    assert main(["--db", f"sqlite:///{tmp_path / 'r.db'}", "bench", "crossover", "--quick"]) == 2
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("opscope: error")]
    assert len(lines) == 1
    err = lines[0]
    assert "only one device here (cpu" in err
    assert "matmul, attention and a decode step" in err and "transfer included" in err
    assert not (tmp_path / "r.db").exists()  # said before any run store is created


def test_crossover_is_where_the_accelerator_wins_from_then_on():
    sizes = [16, 64, 256, 1024, 4096]
    cpu = [0.001, 0.01, 0.5, 30.0, 2000.0]
    acc = [0.01, 0.005, 0.02, 0.3, 10.0]
    xfer = [0.02, 0.02, 0.1, 1.0, 20.0]
    assert crossover.crossover_size(sizes, cpu, acc, xfer) == 256  # 0.12 < 0.5; at 64: 0.025 > 0.01
    # the transfer is what makes the difference at 256: without it the GPU already wins at 64
    assert crossover.crossover_size(sizes, cpu, acc, [0.0] * 5) == 64
    # a win at one size in the middle that is lost again above it is no crossover
    assert crossover.crossover_size([1, 2, 3], [5.0, 1.0, 1.0], [1.0, 2.0, 2.0], [0.0] * 3) is None
    assert crossover.crossover_size([3, 1, 2], [1.0, 1.0, 1.0], [0.5, 2.0, 0.5], [0.0] * 3) == 2  # any order


def _outcome(workload: str, where: str, n: int, ms: float) -> PointOutcome:
    point = Point(crossover.point_name(workload, where, n), "ms", lambda: None, float)
    return PointOutcome(point, [Metric(point.name, "ms", [ms * 0.99, ms, ms * 1.01], False)])


def test_crossover_metrics_from_recorded_points():
    timings = {  # size: (cpu, accelerator, transfer) ms
        16: (0.002, 0.015, 0.02),
        128: (0.15, 0.016, 0.03),
        512: (6.0, 0.05, 0.3),
    }
    outcomes = [
        _outcome("matmul", where, n, t)
        for n, row in timings.items()
        for where, t in zip(("cpu", "accel", "transfer"), row)
    ]
    outcomes += [
        _outcome("decode", where, n, t)
        for n in (64, 576)
        for where, t in zip(("cpu", "accel", "transfer"), (0.01, 0.05, 0.02))
    ]
    note: dict[str, str] = {}
    metrics = crossover.crossover_metrics(
        outcomes, {"matmul": (16, 128, 512), "decode": (64, 576), "attention": (16,)}, "cuda:0", note
    )
    by = {m.name: m for m in metrics}
    assert by["matmul.crossover"].samples == [128.0] and by["matmul.crossover"].status == "ok"
    assert (
        by["decode.crossover"].status == "failed"
        and "CPU is faster up to the largest size swept (576)" in by["decode.crossover"].error
    )
    assert by["attention.crossover"].error == "no size measured on both devices"
    assert note["matmul"] == "cuda:0 with transfer is faster from 128 on"


@pytest.mark.usefixtures("one_torch_thread")
def test_the_whole_suite_runs_with_the_cpu_standing_in_for_the_accelerator():
    """Every point (CPU call, device call, transfer) and the finish step, for real; with the CPU on
    both sides no size can be a clear win, so each workload ends with a crossover metric either way."""
    from opscope.engine.bench.measure.options import BenchOptions
    from opscope.engine.bench.session import run_suite

    params = crossover.Params(matmul=(16, 64), attention=(16,), decode=(64,), accelerator="cpu")
    _, result = run_suite("crossover", BenchOptions(quick=True, threads=1), params=params)
    assert result.status == "completed", result.error
    names = {m.name for m in result.metrics}
    assert {
        "matmul.cpu.16",
        "matmul.accel.64",
        "matmul.transfer.64",
        "attention.transfer.16",
        "decode.accel.64",
    } <= names
    assert {"matmul.crossover", "attention.crossover", "decode.crossover"} <= names
    assert result.settings["suite_params"]["accelerator"] == "cpu"
