"""NVML source against a fake NVML installed into the real ``pynvml`` module (monkeypatched
functions, real ctypes structs, real NVMLError subclasses), and against the real library on this
machine, which has no NVIDIA driver."""

from __future__ import annotations

import argparse
import csv
import logging
import math
import os
import pickle

import pytest

pynvml = pytest.importorskip("pynvml")

from fake_nvml import FakeGpu, FakeHandle, FakeNvml, MiB, _at, _err, fake_uuid  # noqa: E402,F401
from opscope.engine.cli.commands.monitor import register  # noqa: E402
from opscope.engine.telemetry import NA, Sampler  # noqa: E402
from opscope.engine.telemetry.host import HostSource  # noqa: E402
from opscope.engine.telemetry.nvml import GPU_FIELDS, GPU_LOST, Nvml, NvmlSource, describe_reasons  # noqa: E402


@pytest.fixture
def two_gpus(monkeypatch):
    me = os.getpid()
    gpus = [
        FakeGpu("NVIDIA H100 80GB HBM3", procs=((me, 512 * MiB), (99999, 4096 * MiB))),
        FakeGpu("NVIDIA H100 80GB HBM3", unsupported=("nvmlDeviceGetPowerUsage", "nvmlDeviceGetPcieThroughput")),
    ]
    return FakeNvml(gpus).install(monkeypatch)


def test_two_gpus_report_every_field_in_engine_units(two_gpus):
    src = NvmlSource()
    assert src.open()
    assert [d["name"] for d in src.devices] == ["NVIDIA H100 80GB HBM3"] * 2
    assert set(src.units) == {f"gpu{i}.{k}" for i in (0, 1) for k in GPU_FIELDS}
    v = src.sample()
    assert (v["gpu0.util_pct"], v["gpu0.mem_util_pct"]) == (50.0, 20.0)
    assert v["gpu0.mem_used_bytes"] == 1024 * MiB and v["gpu0.mem_total_bytes"] == 80 * 1024 * MiB
    assert v["gpu0.power_w"] == pytest.approx(100.0) and v["gpu0.power_limit_w"] == pytest.approx(700.0)
    assert (v["gpu0.temp_c"], v["gpu0.sm_clock_mhz"], v["gpu0.mem_clock_mhz"]) == (61, 1980, 2619)
    assert (v["gpu0.pcie_tx_bytes_s"], v["gpu0.pcie_rx_bytes_s"]) == (1000 * 1024, 2000 * 1024)
    assert describe_reasons(v["gpu0.clock_event_reasons"]) == "sw_pwr"
    assert v["gpu0.proc_mem_bytes"] == 512 * MiB  # only this process, not pid 99999
    assert math.isnan(v["gpu1.proc_mem_bytes"])  # not listed there: nothing measured, not 0 bytes
    assert src.sample()["gpu0.power_w"] == pytest.approx(200.0)  # scripted values advance
    src.close()
    assert two_gpus.initialized == 0  # close() shut NVML down


def test_unsupported_fields_read_nan_and_are_logged_once(two_gpus, caplog):
    src = NvmlSource()
    src.open()
    with caplog.at_level(logging.DEBUG, logger="opscope.engine.telemetry.nvml"):
        samples = [src.sample() for _ in range(3)]
    for v in samples:
        assert math.isnan(v["gpu1.power_w"]) and math.isnan(v["gpu1.pcie_tx_bytes_s"])
        assert v["gpu1.util_pct"] > 0 and not math.isnan(v["gpu0.power_w"])
    logged = [r for r in caplog.records if "nvmlDeviceGetPowerUsage" in r.getMessage()]
    assert len(logged) == 1 and "Not Supported" in logged[0].getMessage()
    assert two_gpus.calls["nvmlDeviceGetPowerUsage"] == 6  # still asked each tick: N/A is cheap


def test_gpu_lost_mid_run_marks_it_and_the_other_gpu_goes_on(monkeypatch, caplog):
    fake = FakeNvml([FakeGpu("gpu a"), FakeGpu("gpu b", lost_at_tick=2)]).install(monkeypatch)
    sampler = Sampler([NvmlSource()], interval_ms=100)
    with caplog.at_level(logging.ERROR):
        snaps = [sampler.sample_now() for _ in range(5)]
    assert [("gpu1.util_pct" in s.values) for s in snaps] == [True, True, False, False, False]
    assert all("gpu0.util_pct" in s.values for s in snaps)
    t, util1 = sampler.series("gpu1.util_pct")
    assert len(t) == 5 and not any(math.isnan(u) for u in util1[:2]) and all(math.isnan(u) for u in util1[2:])
    assert sampler.status()["nvml"] == "lost: gpu1"
    assert sum("is lost" in r.getMessage() for r in caplog.records) == 1
    # once lost, the source stops talking to the device: one failing call, then none
    assert fake.calls["nvmlDeviceGetUtilizationRates"] == 5 + 2 + 1  # gpu0: 5, gpu1: 2 ok + the lost one
    sampler.stop()


def test_library_not_found_means_no_gpu_and_no_errors(monkeypatch):
    FakeNvml([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND).install(monkeypatch)
    src = NvmlSource()
    assert not src.open()
    assert src.reason == "no NVIDIA GPU (NVML: NVML Shared Library Not Found)"
    assert src.sample() == {} and src.nvml.query("nvmlDeviceGetCount") is NA
    src.close()  # no nvmlShutdown on a library that never initialized


def test_real_nvml_on_this_machine_says_no_gpu():
    nvml = Nvml()
    if nvml.init():
        nvml.shutdown()
        pytest.skip("this machine has an NVIDIA driver")
    src = NvmlSource()
    assert not src.open()
    assert src.reason.startswith("no NVIDIA GPU (NVML: ")


def test_old_driver_falls_back_to_throttle_reasons(monkeypatch):
    FakeNvml([FakeGpu("old")], old_driver=True).install(monkeypatch)
    src = NvmlSource()
    src.open()
    assert describe_reasons(src.sample()["gpu0.clock_event_reasons"]) == "hw_therm"


def test_nvidia_ml_py_older_than_12_535_has_no_clock_event_call(monkeypatch, caplog):
    """nvidia-ml-py before 12.535 lacks nvmlDeviceGetCurrentClocksEventReasons altogether: the
    throttle call answers, and the missing symbol is no WARNING (it is not a fault)."""
    FakeNvml([FakeGpu("old bindings")]).install(monkeypatch)
    monkeypatch.delattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons")
    src = NvmlSource()
    src.open()
    with caplog.at_level(logging.DEBUG, logger="opscope.engine.telemetry.nvml"):
        reasons = [src.sample()["gpu0.clock_event_reasons"] for _ in range(2)]
    src.close()
    assert [describe_reasons(r) for r in reasons] == ["hw_therm", "hw_therm"]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    missing = [r for r in caplog.records if "nvmlDeviceGetCurrentClocksEventReasons" in r.getMessage()]
    assert len(missing) == 1 and "not in this nvidia-ml-py" in missing[0].getMessage()


def test_an_engine_pid_nvml_does_not_list_reads_na_not_zero(two_gpus):
    """No CUDA context yet, or a container whose pids NVML does not report: unknown, not 0 bytes."""
    src = NvmlSource(pids={424242})
    src.open()
    v = src.sample()
    src.close()
    assert math.isnan(v["gpu0.proc_mem_bytes"]) and math.isnan(v["gpu1.proc_mem_bytes"])
    assert v["gpu0.mem_used_bytes"] == 1024 * MiB  # the device's own figures still read


def test_library_version_mismatch_is_na_not_an_exception(monkeypatch):
    fake = FakeNvml([FakeGpu("a", procs=((os.getpid(), 1),))]).install(monkeypatch)

    def mismatch(handle):  # what pynvml's throwOnVersionMismatch raises on an old libnvidia-ml
        raise pynvml.NVMLLibraryMismatchError("Unversioned function called ...")

    monkeypatch.setattr(pynvml, "nvmlDeviceGetComputeRunningProcesses", mismatch)
    src = NvmlSource(pcie=False)
    src.open()
    v = src.sample()
    assert math.isnan(v["gpu0.proc_mem_bytes"]) and math.isnan(v["gpu0.pcie_tx_bytes_s"])
    assert v["gpu0.util_pct"] == 50.0 and "nvmlDeviceGetPcieThroughput" not in fake.calls


def test_na_sentinels_survive_pickling():
    assert pickle.loads(pickle.dumps(NA)) is NA and pickle.loads(pickle.dumps(GPU_LOST)) is GPU_LOST
    assert not NA and math.isnan(float(NA)) and repr(NA) == "N/A"


def _monitor(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="opscope")
    register(parser.add_subparsers())
    args = parser.parse_args(["monitor", *argv])
    return args.func(args)


def test_monitor_shows_both_gpus_and_writes_csv(two_gpus, capsys, tmp_path):
    out_csv = tmp_path / "mon.csv"
    assert _monitor(["--interval", "50", "--duration", "0.3", "--csv", str(out_csv)]) == 0
    out = capsys.readouterr().out
    assert "no NVIDIA GPU" not in out
    assert "# NVIDIA" in out and "# host" in out
    gpu1_lines = [line for line in out.splitlines() if line.startswith("gpu1 ")]
    assert gpu1_lines and " - " in gpu1_lines[0]  # its unsupported power reads "-"
    rows = list(csv.DictReader(out_csv.open()))
    assert rows and float(rows[0]["gpu0.util_pct [%]"]) == 50.0
    assert rows[0]["gpu1.power_w [W]"] == ""


def test_monitor_without_gpu_says_so_once_and_shows_the_host(monkeypatch, capsys):
    FakeNvml([], init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND).install(monkeypatch)
    assert _monitor(["--interval", "50", "--duration", "0.25"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out.count("no NVIDIA GPU (NVML: NVML Shared Library Not Found)") == 1
    assert any(line.startswith("host ") for line in out)
    assert not any(line.startswith("gpu") for line in out)


def test_host_source_is_independent_of_nvml(two_gpus):
    # the monitor's two main sources sampled together in one tick, one snapshot each
    sampler = Sampler([HostSource(), NvmlSource()], interval_ms=100)
    snap = sampler.sample_now()
    assert "host.cpu_pct" in snap.values and "gpu1.util_pct" in snap.values
    sampler.stop()


def test_live_tables_render_one_row_per_gpu(two_gpus):
    from io import StringIO

    from opscope.engine.telemetry.view import MonitorView
    from rich.console import Console

    sampler = Sampler([HostSource(), NvmlSource()], interval_ms=100)
    snap = sampler.sample_now()
    console = Console(file=StringIO(), width=220, color_system=None)
    for table in MonitorView(sampler.series_names()).tables(snap.values):
        console.print(table)
    text = console.file.getvalue()
    sampler.stop()
    assert "NVIDIA GPUs" in text and "host" in text
    gpu_rows = [line for line in text.splitlines() if "gpu0" in line or "gpu1" in line]
    assert len(gpu_rows) == 2 and "1.00GiB" in gpu_rows[0] and "sw_pwr" in gpu_rows[0]


def test_set_pids_follows_another_process_and_none_reads_na(two_gpus):
    src = NvmlSource()
    src.open()
    src.set_pids({99999})  # e.g. the engine worker, which is not this process
    assert src.sample()["gpu0.proc_mem_bytes"] == 4096 * MiB
    src.set_pids(set())  # no worker running: nothing to attribute
    assert math.isnan(src.sample()["gpu0.proc_mem_bytes"])
    src.close()
