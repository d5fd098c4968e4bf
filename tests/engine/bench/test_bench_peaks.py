"""Peaks MFU/MBU divide by: theoretical (from /proc/cpuinfo or NVML + datasheet) and measured (only by a
full, quiet run; replaced only when beaten; invalidated when exceeded). Never above 100% in a table."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from opscope.engine.bench.ceilings import peaks, theoretical
from opscope.engine.bench.measure.options import BenchOptions
from opscope.engine.bench.session import run_suite
from opscope.engine.bench.suites import matmul

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def quiet_proc(base: Path) -> Path:
    """A /proc whose counters never move: no other process is busy (this machine is never quiet)."""
    proc = base / "proc"
    (proc / "self").mkdir(parents=True, exist_ok=True)
    (proc / "stat").write_text("cpu  1000 0 500 90000 10 0 5 0 0 0\ncpu0 500 0 250 45000 5 0 2 0 0 0\n")
    (proc / "self" / "stat").write_text("4242 (python) R 1 1 1 0 -1 0 0 0 0 0 300 40 " + "0 " * 30 + "\n")
    return proc


@pytest.fixture
def busy_cpu():
    """Another process spinning on a core while the test runs: real foreign load."""
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    yield spin
    spin.kill()
    spin.wait()


# --- measured: who may set it ------------------------------------------------------------------


def test_a_quick_or_busy_run_never_sets_the_measured_peak():
    said = peaks.record_measured("cpu", "matmul", "float32", 300e9, "x", quick=True, other_cores=0.0)
    assert said.startswith("not recorded: a --quick run")
    said = peaks.record_measured("cpu", "matmul", "float32", 300e9, "x", quick=False, other_cores=0.8)
    assert said.startswith("not recorded: other processes kept 0.80 cores busy")
    assert peaks.measured("cpu", "matmul", "float32") is None


def test_a_quiet_full_run_sets_it_and_only_a_better_one_replaces_it():
    said = peaks.record_measured("cpu", "matmul", "float32", 180e9, "run 1", quick=False, other_cores=0.02)
    assert said == "recorded 180.0 GFLOP/s as the measured peak"
    said = peaks.record_measured("cpu", "matmul", "float32", 150e9, "run 2", quick=False, other_cores=0.0)
    assert said.startswith("kept the stored peak 180.0 GFLOP/s")
    peaks.record_measured("cpu", "matmul", "float32", 190e9, "run 3", quick=False, other_cores=0.0)
    peak = peaks.measured("cpu", "matmul", "float32")
    assert (peak.value, peak.source, peak.basis) == (190e9, "run 3", "measured")
    e = peaks.entry("cpu", "matmul", "float32")
    assert e["fingerprint"]["device"] == peaks.device_key("cpu") and e["fingerprint"]["torch"]
    assert e["taken"].endswith("Z") and e["other_cores"] == 0.0
    assert peak.label == f"measured 190.0 GFLOP/s float32 ({e['taken'][:10]})"


def test_an_invalidated_peak_is_not_used_and_a_later_quiet_run_replaces_it():
    peaks.record_measured("cpu", "bandwidth", None, 40e9, "bw", quick=False, other_cores=0.0)
    peaks.invalidate("cpu", "bandwidth", None, by="tg128.mbu_measured", pct=131.0)
    assert peaks.measured("cpu", "bandwidth") is None
    assert "invalidated: tg128.mbu_measured went past it" in peaks.measured_note("cpu", "bandwidth", None)
    peaks.record_measured("cpu", "bandwidth", None, 35e9, "bw again", quick=False, other_cores=0.0)
    assert peaks.measured("cpu", "bandwidth").value == 35e9


def test_peaks_cached_by_the_old_quick_measurement_are_ignored(cache_dir):
    cache_dir.mkdir(parents=True)
    old = {peaks.device_key("cpu"): {"matmul:float32": {"value": 8.3e9, "source": "quick matmul_float32_512", "t": 0}}}
    (cache_dir / "peaks.json").write_text(json.dumps(old))
    assert peaks.measured("cpu", "matmul", "float32") is None
    assert peaks.get("cpu", "matmul", "float32").basis == "theoretical"


# --- theoretical: CPU from /proc/cpuinfo, GPU from NVML + datasheet ----------------------------


def _cpuinfo(
    tmp_path: Path, flags: str, n_cpus: int, cores_per_socket: int, mhz: float, max_khz: int | None = None
) -> tuple[Path, Path]:
    blocks = [
        f"processor\t: {i}\nmodel name\t: Test CPU\ncpu MHz\t\t: {mhz:.3f}\nphysical id\t: 0\n"
        f"core id\t\t: {i % cores_per_socket}\ncpu cores\t: {cores_per_socket}\nflags\t\t: {flags}\n"
        for i in range(n_cpus)
    ]
    info = tmp_path / "cpuinfo"
    info.write_text("\n".join(blocks))
    sys_cpu = tmp_path / "sys"
    if max_khz:
        (sys_cpu / "cpu0" / "cpufreq").mkdir(parents=True)
        (sys_cpu / "cpu0" / "cpufreq" / "cpuinfo_max_freq").write_text(f"{max_khz}\n")
    return info, sys_cpu


@pytest.mark.parametrize(
    "flags, dtype, per_cycle",
    [
        ("fpu sse2 avx avx2 fma avx512f avx512bw", "float32", 64),  # 2 FMA units × 16 lanes × 2
        ("fpu sse2 avx avx2 fma avx512f avx512_bf16", "bfloat16", 128),  # VDPBF16PS: twice fp32
        ("fpu sse2 avx avx2 fma avx512f amx_bf16 avx512_bf16", "bfloat16", 1024),  # AMX tiles
        ("fpu sse2 avx avx2 fma", "float32", 32),
        ("fpu sse2 avx avx2 fma", "bfloat16", 32),  # no native bf16: computed at the fp32 rate
        ("fpu sse2 avx", "float32", 16),
        ("fp asimd evtstrm", "float32", 16),
    ],
)
def test_cpu_theoretical_peak_from_cpuinfo_flags(tmp_path, flags, dtype, per_cycle):
    info, sys_cpu = _cpuinfo(tmp_path, flags, n_cpus=4, cores_per_socket=4, mhz=2300.0, max_khz=3_000_000)
    spec = theoretical.cpu_spec(info, sys_cpu, usable=None)
    value, how = theoretical.cpu_flop_s(spec, dtype)
    assert value == pytest.approx(4 * 3.0e9 * per_cycle)
    assert "4 cores × 3.00 GHz (cpuinfo_max_freq)" in how and f"× {per_cycle} FLOP/cycle" in how


def test_without_cpufreq_the_nominal_clock_gets_a_stated_turbo_allowance(tmp_path):
    info, sys_cpu = _cpuinfo(tmp_path, "avx2 fma avx512f", n_cpus=2, cores_per_socket=2, mhz=2300.0)
    spec = theoretical.cpu_spec(info, sys_cpu, usable=None)
    assert spec.hz == pytest.approx(2.3e9 * theoretical.TURBO_ALLOWANCE) == pytest.approx(4.6e9)
    value, how = theoretical.cpu_flop_s(spec, "float32")
    assert value == pytest.approx(2 * 4.6e9 * 64)
    assert "2 × 2.30 GHz cpu MHz: turbo allowance, no cpufreq maximum" in how


def test_cpu_peak_counts_physical_cores_threads_and_the_max_clock(tmp_path):
    # 8 logical CPUs on 4 cores (hyperthreads share the FMA units); cpufreq knows the boost clock
    info, sys_cpu = _cpuinfo(tmp_path, "avx2 fma", n_cpus=8, cores_per_socket=4, mhz=2000.0, max_khz=3_500_000)
    spec = theoretical.cpu_spec(info, sys_cpu, usable=None)
    assert (spec.cores, spec.hz, spec.clock_source) == (4, 3.5e9, "cpuinfo_max_freq")
    assert theoretical.cpu_flop_s(spec, "float32")[0] == pytest.approx(4 * 3.5e9 * 32)
    assert theoretical.cpu_flop_s(spec, "float32", threads=2)[0] == pytest.approx(2 * 3.5e9 * 32)
    only_two = theoretical.cpu_spec(info, sys_cpu, usable={0, 4})  # two logical CPUs, one core
    assert only_two.cores == 1


def test_this_machines_theoretical_peak_is_a_ceiling_for_matmul(store_path):
    import torch

    peak = peaks.theoretical("cpu", "matmul", "float32")
    assert peak.basis == "theoretical" and peak.label.startswith("theoretical ") and "FLOP/cycle" in peak.source
    _, result = run_suite(
        "matmul",
        BenchOptions(quick=True, repeat=3, min_time_s=0, threads=torch.get_num_threads()),
        None,
        params=matmul.Params(dtypes=("float32",), sizes=(256,)),
    )
    gflops = {m.name: m for m in result.metrics}["matmul_float32_256"].samples
    assert max(gflops) * 1e9 < peak.value


@pytest.fixture
def store_path(tmp_path):
    return tmp_path / "runs.db"


class _Gpus:
    """Adds the maximum-clock and bus-width queries to the telemetry tests' fake NVML."""

    @staticmethod
    def install(monkeypatch, name: str, sm_mhz: int, mem_mhz: int, bus_bits: int):
        pynvml = pytest.importorskip("pynvml")
        from fake_nvml import FakeGpu, FakeNvml

        class FakeWithClocks(FakeNvml):
            def nvmlDeviceGetMaxClockInfo(self, h, clock_type):
                self._gpu(h, "nvmlDeviceGetMaxClockInfo")
                return {pynvml.NVML_CLOCK_SM: sm_mhz, pynvml.NVML_CLOCK_MEM: mem_mhz}[clock_type]

            def nvmlDeviceGetMemoryBusWidth(self, h):
                self._gpu(h, "nvmlDeviceGetMemoryBusWidth")
                return bus_bits

        return FakeWithClocks([FakeGpu(name)]).install(monkeypatch)


@pytest.mark.parametrize(
    "gpu, sm, mem, bus, bf16_tflops, tb_s",
    [
        ("NVIDIA H100 80GB HBM3", 1980, 2619, 5120, 989, 3.352),
        ("NVIDIA H100 PCIe", 1755, 1593, 5120, 756, 2.039),
        ("NVIDIA A100-SXM4-80GB", 1410, 1593, 5120, 312, 2.039),
        ("NVIDIA L4", 2040, 6251, 192, 121, 0.300),
        ("NVIDIA GeForce RTX 4090", 2520, 10501, 384, 165.2, 1.008),
    ],
)
def test_gpu_theoretical_peak_from_nvml_clocks_and_the_datasheet(monkeypatch, gpu, sm, mem, bus, bf16_tflops, tb_s):
    nvml = _Gpus.install(monkeypatch, gpu, sm, mem, bus)
    flop = peaks._gpu_theoretical(0, "matmul", "bfloat16")
    bw = peaks._gpu_theoretical(0, "bandwidth", None)
    assert flop.value == pytest.approx(bf16_tflops * 1e12) and flop.basis == "theoretical"
    assert "max SM clock (NVML)" in flop.source
    assert bw.value == pytest.approx(tb_s * 1e12, rel=1e-3) and "bus (NVML)" in bw.source
    assert nvml.initialized == 0  # each lookup shut its NVML session down


def test_a_gpu_clocked_below_its_datasheet_boost_has_a_lower_peak(monkeypatch):
    _Gpus.install(monkeypatch, "NVIDIA H100 80GB HBM3", 1590, 2619, 5120)  # a clock-capped board
    assert peaks._gpu_theoretical(0, "matmul", "float32").value == pytest.approx(67e12 * 1590 / 1980)


def test_datasheet_names_match_whole_words():
    assert theoretical.datasheet_row("NVIDIA L40S")[0] == "L40S"
    assert theoretical.datasheet_row("NVIDIA A10")[0] == "A10"
    assert theoretical.datasheet_row("NVIDIA A100-PCIE-40GB")[0] == "A100"
    assert theoretical.datasheet_row("Tesla T4")[0] == "T4"
    assert theoretical.datasheet_row("NVIDIA GeForce GTX 1080") is None


# --- the matmul suite: records when quiet, never prints above 100% -----------------------------

FULL = dict(repeat=5, min_time_s=0.0, warmup=1)


def test_a_quiet_full_matmul_run_records_its_fastest_repetition(tmp_path, monkeypatch):
    monkeypatch.setattr(peaks, "PROC", quiet_proc(tmp_path))
    _, result = run_suite(
        "matmul", BenchOptions(**FULL), None, params=matmul.Params(dtypes=("float32",), sizes=(32, 64))
    )
    m = {x.name: x for x in result.metrics}
    best = max((max(m[f"matmul_float32_{n}"].samples), n) for n in (32, 64))
    peak = peaks.measured("cpu", "matmul", "float32")
    assert peak.value == pytest.approx(best[0] * 1e9) and f"n={best[1]}" in peak.source
    mine = m[f"matmul_float32_{best[1]}.pct_peak_measured"]
    assert mine.status == "ok" and max(mine.samples) == pytest.approx(100.0) and mine.params["peak"] == peak.label
    assert result.settings["suite_params"]["peak_record"]["float32"].startswith("recorded")


def test_a_planted_slowdown_run_records_nothing_even_when_quiet(tmp_path, monkeypatch):
    monkeypatch.setattr(peaks, "PROC", quiet_proc(tmp_path))
    _, result = run_suite(
        "matmul", BenchOptions(**FULL), None, params=matmul.Params(dtypes=("float32",), sizes=(32,), planted_slowdown=2)
    )
    assert peaks.measured("cpu", "matmul", "float32") is None
    assert result.settings["suite_params"]["peak_record"]["float32"].startswith("not recorded: a planted")


def test_a_matmul_run_beside_a_busy_process_records_nothing(busy_cpu):
    _, result = run_suite(
        "matmul", BenchOptions(**FULL), None, params=matmul.Params(dtypes=("float32",), sizes=(64,), call_budget_s=5)
    )
    assert peaks.measured("cpu", "matmul", "float32") is None
    said = result.settings["suite_params"]["peak_record"]["float32"]
    assert said.startswith("not recorded: other processes kept") and "cores busy" in said


def test_exceeding_a_measured_peak_invalidates_it_and_no_table_prints_it():
    from opscope.engine.bench.report import summary_table

    peaks.record("cpu", "matmul", "float32", 0.5e9, "a peak taken on a busy machine")
    _, result = run_suite(
        "matmul", BenchOptions(quick=True, **FULL), None, params=matmul.Params(dtypes=("float32",), sizes=(64,))
    )
    m = {x.name: x for x in result.metrics}
    over = m["matmul_float32_64.pct_peak_measured"]
    assert over.status == "failed" and over.error.startswith("invalid: reached ")
    assert "GFLOP/s, above the measured 500.0 MFLOP/s float32" in over.error
    assert "now invalidated; see matmul_float32_64.pct_peak (of the theoretical peak)" in over.error
    assert min(over.samples) > 100  # the raw samples are kept; only the display refuses them
    assert peaks.measured("cpu", "matmul", "float32") is None
    assert peaks.entry("cpu", "matmul", "float32")["invalidated"]["by"] == "matmul_float32_64.pct_peak_measured"
    out = io.StringIO()
    summary_table(result, None, out)
    row = next(ln for ln in out.getvalue().splitlines() if "pct_peak_measured" in ln)
    cells = [c.strip() for c in row.split("│")]
    assert cells[3:7] == ["invalid", "", "", ""]  # median, ± CI, CI, n: no number shown
    theory = next(ln for ln in out.getvalue().splitlines() if "matmul_float32_64.pct_peak " in ln)
    assert "% of theor. " in theory and "MFU" not in theory
    assert "float32 matmul peak: theoretical " in out.getvalue()  # the lines under the table say which
