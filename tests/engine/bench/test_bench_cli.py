"""`opscope bench` end to end, and the session's cancel path, on real SQLite stores."""

from __future__ import annotations

import threading

import pytest
from opscope.engine.bench.ceilings import peaks
from opscope.engine.bench.measure.options import BenchOptions
from opscope.engine.bench.session import run_suite
from opscope.engine.bench.suites import matmul
from opscope.engine.cli.main import main
from opscope.engine.core.errors import Cancelled

FAST = ["--quick", "--repeat", "2", "--min-time", "0", "--warmup", "0"]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_cancel_mid_suite_keeps_finished_points_and_marks_the_run_aborted(db):
    from opscope.engine.store import RunStore

    cancel = threading.Event()

    def progress(done, total, eta):
        if done >= 1:  # the first point is finished and committed
            cancel.set()

    params = matmul.Params(dtypes=("float32",), sizes=(16, 32, 64))
    with RunStore.open(db) as store:
        with pytest.raises(Cancelled):
            run_suite(
                "matmul",
                BenchOptions(quick=True, repeat=2, min_time_s=0),
                store,
                params=params,
                name="cancelled",
                cancel=cancel,
                progress=progress,
            )
        saved = store.load("cancelled")
    assert saved.info.status == "aborted"
    assert [m.name for m in saved.result.metrics] == ["matmul_float32_16"]


@pytest.mark.slow
def test_bench_saves_prints_and_compares(db, capsys):
    assert main(["--db", db, "bench", "bandwidth", *FAST, "--name", "bw-a", "--tag", "t1"]) == 0
    out = capsys.readouterr().out
    assert "copy_64MiB" in out and "GB/s" in out and "saved as run" in out
    assert main(["--db", db, "bench", "bandwidth", *FAST, "--name", "bw-b"]) == 0
    capsys.readouterr()
    assert main(["--db", db, "runs", "compare", "bw-a", "bw-b"]) == 0
    assert "copy_64MiB" in capsys.readouterr().out
    from opscope.engine.store import RunStore

    with RunStore.open(db) as store:
        info = store.info("bw-a")
        assert info.status == "completed" and info.tags == ("t1",) and info.kind == "bandwidth"
        assert peaks.measured("cpu", "bandwidth", None) is None  # --quick sizes are no peak


def test_unavailable_device_is_one_line_and_exit_2(db, capsys):
    assert main(["--db", db, "bench", "matmul", "--device", "cuda", *FAST]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("opscope: error:") and "cuda" in err[0]


def test_param_sets_suite_parameters_and_is_saved(db, capsys):
    args = ["--db", db, "bench", "matmul", *FAST, "--name", "mm", "--param", "sizes=16,32", "--param", "dtypes=float32"]
    assert main(args) == 0
    capsys.readouterr()
    from opscope.engine.store import RunStore

    with RunStore.open(db) as store:
        run = store.load("mm").result
    assert sorted(
        {m.name for m in run.metrics if not m.name.endswith(".pct_peak")}
        & {"matmul_float32_16", "matmul_float32_32", "matmul_float32_64"}
    ) == ["matmul_float32_16", "matmul_float32_32"]
    assert run.settings["suite_params"]["dtypes"] == ["float32"]


@pytest.mark.parametrize(
    "param, message",
    [("size=16", "KEY=VALUE with KEY one of"), ("sizes=sixteen", "cannot read 'sixteen'"), ("sizes", "KEY=VALUE")],
)
def test_bad_param_is_one_line_and_exit_2(db, capsys, param, message):
    assert main(["--db", db, "bench", "matmul", *FAST, "--param", param]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


@pytest.mark.parametrize("lr", ["0.003", "0.5", "1e-9"])
def test_a_real_parameter_below_one_is_accepted(lr):
    from opscope.engine.bench.measure.params import parse_cli_params
    from opscope.engine.bench.suites import train_step

    # a learning rate is a real number > 0: the default 0.003 itself must pass
    assert parse_cli_params(train_step, [f"lr={lr}"], quick=True).lr == float(lr)


@pytest.mark.parametrize("lr", ["0", "-0.1", "nan", "inf"])
def test_a_real_parameter_not_above_zero_is_one_line_and_exit_2(db, capsys, lr):
    assert main(["--db", db, "bench", "train-step", "--quick", "--param", f"lr={lr}"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"opscope: error: --param lr: {float(lr)} is out of range: use a finite number > 0"


def test_bad_repeat_is_a_user_error(db, capsys):
    with pytest.raises(SystemExit) as e:  # checked by the parser, before anything runs
        main(["--db", db, "bench", "matmul", "--repeat", "0"])
    assert e.value.code == 2 and "--repeat" in capsys.readouterr().err


def test_suite_help_lists_each_parameter_with_its_default_unit_and_help(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "matmul", "--help"])
    assert e.value.code == 0
    lines = capsys.readouterr().out.splitlines()
    start = lines.index("matmul parameters (--param KEY=VALUE, default shown):")
    assert lines[start + 1 :] == [
        "  dtypes=float32,bfloat16,float16  Data types: Element types measured, each at every size (float32, "
        "bfloat16, float16).",
        "  sizes=128,256,512,1024,2048,4096,8192  Matrix sizes (n×n): Square matrix sizes n: each point multiplies "
        "two n×n matrices (2·n³ FLOP).",
        "  call_budget_s=2.0  Call budget (s): Skip a size whose single call is predicted (from the smaller sizes) "
        "to take longer than this.",
        "  planted_slowdown=1.0  Planted slowdown (×): A deliberate regression to check comparisons end to end: "
        "1 = off, 2 halves the reported rate, 1.1 is 10 % slower.",
    ]


def test_every_suite_help_describes_every_parameter(capsys):
    import dataclasses

    from opscope.engine.bench.suites import SUITES, get_suite

    for suite in SUITES:
        with pytest.raises(SystemExit):
            main(["bench", suite, "-h"])
        out = capsys.readouterr().out.split(f"{suite} parameters (--param KEY=VALUE, default shown):\n")[1]
        names = [f.name for f in dataclasses.fields(get_suite(suite).Params)]
        assert [line.split("=")[0].strip() for line in out.splitlines()] == names, suite
        for line, name in zip(out.splitlines(), names, strict=True):
            described = line.split("  ", 2)[2]  # after "  name=default  "
            label, _, text = described.partition(": ")
            assert label[0].isupper() and "_" not in label and len(text) > 20, (suite, name, line)


def test_unknown_suite_is_rejected_by_the_parser(db, capsys):
    with pytest.raises(SystemExit) as e:
        main(["--db", db, "bench", "nope"])
    assert e.value.code == 2 and "llm" in capsys.readouterr().err


def test_telemetry_and_bench_iter_markers_are_saved_with_the_run(db):
    from opscope.engine.store import RunStore
    from opscope.engine.telemetry.recorder import Recorder

    rec = Recorder(None)  # markers only: no sampler thread on a shared 2-core machine
    params = matmul.Params(dtypes=("float32",), sizes=(16,))
    live: list = []
    with RunStore.open(db) as store:
        run_id, _ = run_suite(
            "matmul",
            BenchOptions(quick=True, repeat=3, min_time_s=0),
            store,
            params=params,
            recorder=rec,
            on_metric=live.append,
        )
        saved = store.get(run_id)
    assert [m.name for m in live] == [m.name for m in saved.metrics]
    iters = [m for m in saved.markers if m.phase == "bench_iter"]
    assert len(iters) == 2 * len(saved.metrics[0].samples)
    assert {m.attrs["point"] for m in iters} == {"matmul_float32_16"}


def test_summary_table_states_the_peaks_and_never_prints_above_100_pct():
    import io

    from opscope.engine.bench.report import summary_table
    from opscope.engine.core.results import Metric, RunResult

    peaks_used = {"flop_s": 1e9, "flop_source": "measured: matmul suite, n=128", "bytes_s": None}
    run = RunResult(
        kind="scaling",
        settings={"suite_params": {"peaks": peaks_used}},
        metrics=[
            Metric("fwd_gpt2-small", "tok/s", [4.0, 5.0, 6.0]),
            Metric("fwd_gpt2-small.mfu", "%", [150.0, 160.0, 170.0]),
            Metric("fwd_gpt2-xl", "tok/s", [], status="failed", error="skipped: needs ~9 GiB, 4 GiB free"),
            Metric("odd", "ms", [], status="failed", error="bad [/bold] x"),
        ],
    )
    out = io.StringIO()
    summary_table(run, 7, out)
    text = out.getvalue()
    assert "saved as run 7" in text and "skipped: needs ~9 GiB" in text
    assert "MFU peak: 1.000 GFLOP/s (measured: matmul suite, n=128)" in text and "MBU peak" not in text
    row = next(ln for ln in text.splitlines() if "fwd_gpt2-small.mfu" in ln)
    assert "invalid" in row and not any(v in text for v in ("150", "160", "170"))
    assert "bad [/bold] x" in text  # error text is shown, not read as markup


def test_load_threshold_flag_sets_when_a_repetition_is_disturbed(db, capsys):
    from opscope.engine.store import RunStore

    tiny = ["--param", "sizes=32", "--param", "dtypes=float32"]
    # 64 cores of foreign load cannot happen on any machine this runs on: nothing is disturbed
    assert main(["--db", db, "bench", "matmul", "--quick", *tiny, "--load-threshold", "64", "--name", "lax"]) == 0
    with RunStore.open(db) as store:
        run = store.load("lax").result
    assert run.settings["load_threshold"] == 64.0 and run.settings["runner"]["disturbed_cores"] == 64.0
    assert all(m.quality != "disturbed" for m in run.metrics)
    assert main(["--db", db, "bench", "matmul", "--quick", *tiny, "--name", "default"]) == 0
    with RunStore.open(db) as store:
        assert store.load("default").result.settings["runner"]["disturbed_cores"] == 0.25
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main(["--db", db, "bench", "matmul", "--load-threshold", "-1"])
    assert e.value.code == 2 and "--load-threshold: -1 is out of range" in capsys.readouterr().err
