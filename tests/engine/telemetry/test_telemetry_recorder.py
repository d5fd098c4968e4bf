"""Phase markers + samples on one clock: pairing, per-phase summaries (energy from power), the
Recorder, CSV/JSON export, and markers from a real generation with the default model."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import psutil
import pytest
from opscope.engine.core import markers
from opscope.engine.core.clock import now_ns
from opscope.engine.core.results import Marker, RunResult, TelemetrySeries
from opscope.engine.telemetry import Recorder, Sampler, Source, pair_phases, read_json, summarize, write_csv, write_json
from opscope.engine.telemetry.summary import summarize_series

S = 1_000_000_000  # ns per second


class PowerSource(Source):
    """A GPU-like power series (W) that follows the engine's phase: 300 W in prefill/decode,
    50 W otherwise; stands in for the NVML power reading on a machine without a GPU."""

    name = "power"

    def __init__(self) -> None:
        super().__init__()
        self.busy = False

    def _open(self) -> None:
        self._ready({"gpu0.power_w": "W", "gpu0.util_pct": "%"})

    def _sample(self) -> dict[str, float]:
        return {"gpu0.power_w": 300.0 if self.busy else 50.0, "gpu0.util_pct": 90.0 if self.busy else 0.0}


def test_energy_is_the_integral_of_power():
    t = np.array([0, 1, 2, 3]) * S
    s = summarize_series(t, np.array([100.0, 100.0, 100.0, 100.0]), 0, 2 * S, power=True)
    assert s.energy_j == pytest.approx(200.0) and s.mean == pytest.approx(100.0)
    ramp = summarize_series(t, np.array([0.0, 100.0, 200.0, 300.0]), 1 * S, 3 * S, power=True)
    assert ramp.energy_j == pytest.approx(400.0) and ramp.max == 300.0 and ramp.n_samples == 1


def test_a_phase_between_two_samples_interpolates_its_edges():
    t = np.array([0, 1]) * S
    s = summarize_series(t, np.array([0.0, 100.0]), S // 4, S // 2, power=True)  # 25 → 50 W
    assert s.n_samples == 0 and s.mean == pytest.approx(37.5) and s.energy_j == pytest.approx(9.375)


def test_nan_samples_are_skipped_and_all_nan_is_nan():
    t = np.array([0, 1, 2]) * S
    s = summarize_series(t, np.array([10.0, math.nan, 10.0]), 0, 2 * S, power=True)
    assert s.energy_j == pytest.approx(20.0)
    empty = summarize_series(t, np.full(3, math.nan), 0, 2 * S, power=False)
    assert math.isnan(empty.mean) and empty.energy_j is None


def test_pair_phases_nests_repeats_and_closes_open_ones():
    ms = [
        Marker("bench_iter", "start", 1, {"rep": 0}),
        Marker("bench_iter", "end", 2),
        Marker("bench_iter", "start", 3, {"rep": 1}),
        Marker("decode", "end", 4),  # stray end
        Marker("bench_iter", "end", 5),
        Marker("prefill", "start", 6),
    ]
    assert pair_phases(ms, end_ns=9) == [
        ("bench_iter", 1, 2, {"rep": 0}),
        ("bench_iter", 3, 5, {"rep": 1}),
        ("prefill", 6, 9, {"open": True}),
    ]


def test_recorder_cuts_samples_by_phase():
    power = PowerSource()
    sampler = Sampler([power], interval_ms=20).start()
    with Recorder(sampler) as rec:
        for phase in (markers.PREFILL, markers.DECODE):
            power.busy = True
            with markers.phase(phase):
                _wait_ticks(sampler, 5)
            power.busy = False
        _wait_ticks(sampler, 3)
    sampler.stop()
    assert [(m.phase, m.edge) for m in rec.markers] == [
        ("prefill", "start"),
        ("prefill", "end"),
        ("decode", "start"),
        ("decode", "end"),
    ]
    phases = rec.phases()
    assert [p.phase for p in phases] == ["prefill", "decode"]
    for p in phases:
        s = p.series["gpu0.power_w"]
        assert s.n_samples >= 3 and s.max == 300.0
        # mostly busy samples inside; only the edges may interpolate toward 50 W
        assert 150.0 < s.mean <= 300.0
        assert p.energy_j == pytest.approx(s.mean * p.duration_ms / 1e3, rel=1e-6)
    run = rec.attach(RunResult(kind="generate"))
    assert {s.name for s in run.telemetry} == {"gpu0.power_w", "gpu0.util_pct"} and len(run.markers) == 4
    t = run.telemetry[0].t_ns
    assert t[0] <= rec.start_ns and t[-1] >= rec.end_ns  # the window is covered at both ends


def _wait_ticks(sampler: Sampler, n: int) -> None:
    import threading

    seen, done = [0], threading.Event()

    def on(_snap) -> None:
        seen[0] += 1
        if seen[0] >= n:
            done.set()

    unsubscribe = sampler.subscribe(on)
    assert done.wait(10)
    unsubscribe()


def _window() -> tuple[list[TelemetrySeries], list[Marker]]:
    series = [
        TelemetrySeries("gpu0.power_w", "W", [0, S, 2 * S], [100.0, math.nan, 300.0]),
        TelemetrySeries("host.cpu_pct", "%", [0, S, 2 * S], [5.5, 10.0, 12.0]),
    ]
    return series, [Marker("decode", "start", S // 2, {"tokens": 3}), Marker("decode", "end", 2 * S)]


def test_csv_is_wide_with_marker_rows(tmp_path):
    series, marks = _window()
    path = tmp_path / "w.csv"
    assert write_csv(path, series, marks) == 4  # three sample rows + one marker-only row
    rows = list(csv.DictReader(path.open()))
    assert list(rows[0]) == ["t_ns", "t_s", "gpu0.power_w [W]", "host.cpu_pct [%]", "markers"]
    assert [r["markers"] for r in rows] == ["", "decode:start", "", "decode:end"]
    assert rows[2]["gpu0.power_w [W]"] == "" and rows[0]["host.cpu_pct [%]"] == "5.5"
    assert rows[3]["t_s"] == "2.000000"


def test_json_round_trips_and_writes_nan_as_null(tmp_path):
    series, marks = _window()
    summary = summarize(series, "decode", S // 2, 2 * S)
    path = tmp_path / "w.json"
    write_json(path, series, marks, [summary])
    data = json.loads(path.read_text())
    assert data["series"][0]["values"] == [100.0, None, 300.0]
    # NaN skipped: the curve runs 100 W -> 300 W over 0..2 s, i.e. 150 W at 0.5 s
    assert data["phases"][0]["series"]["gpu0.power_w"]["energy_j"] == pytest.approx(337.5)
    back_series, back_marks = read_json(path)
    assert back_marks == marks
    assert back_series[1] == series[1] and math.isnan(back_series[0].values[1])


# --- a real generation -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def model():
    api = pytest.importorskip("opscope.engine.api")
    return api.load()


@pytest.mark.slow
def test_phases_of_a_real_generation_line_up_with_samples(model):
    from opscope.engine.generation.events import Finished
    from opscope.engine.generation.generate import GenerationConfig
    from opscope.engine.telemetry.host import HostSource

    sampler = Sampler([HostSource()], interval_ms=20).start()
    t_before = now_ns()
    with Recorder(sampler) as rec:
        events = list(model.generate("The capital of France is", GenerationConfig(max_tokens=6, ignore_eos=True)))
    sampler.stop()
    finished = [e for e in events if isinstance(e, Finished)][0]
    edges = [(m.phase, m.edge) for m in rec.markers]
    assert edges == [("prefill", "start"), ("prefill", "end"), ("decode", "start"), ("decode", "end")]
    assert t_before <= rec.markers[0].t_ns and rec.markers[-1].t_ns <= rec.end_ns
    prefill, decode = rec.phases()
    # the markers are the generation's own timestamps: same clock as the events
    assert decode.end_ns == finished.t_ns and decode.attrs["tokens"] == 6
    assert prefill.end_ns == decode.start_ns
    assert rec.start_ns <= prefill.start_ns < prefill.end_ns < decode.end_ns <= rec.end_ns
    cpu = decode.series["proc.cpu_pct"]
    assert cpu.n_samples >= 1 and cpu.mean > 0  # the sampler saw this process working during decode
    t, _ = sampler.series("proc.cpu_pct", decode.start_ns, decode.end_ns)
    # one sample per 20 ms tick, less the slots a busy machine makes the sampler miss
    assert len(t) >= cpu.n_samples >= 0.25 * decode.duration_ms / 20
    assert cpu.max <= 100.0 * psutil.cpu_count()  # jiffy-quantized CPU time is clamped
