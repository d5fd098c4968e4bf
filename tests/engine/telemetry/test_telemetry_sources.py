"""Host (real psutil), allocator (real MLX; torch on CPU) and AMD (fake amdsmi) sources."""

from __future__ import annotations

import logging
import math
import subprocess
import sys
import time
import types

import psutil
import pytest
from opscope.engine.telemetry.allocators import MlxSource, TorchCudaSource
from opscope.engine.telemetry.amd import AMD_FIELDS, AmdSmiSource
from opscope.engine.telemetry.host import HostSource
from opscope.engine.telemetry.sources import default_sources


def _burn_cpu(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_host_reports_cpu_ram_and_this_process():
    src = HostSource()
    assert src.open()
    n_cores = psutil.cpu_count()
    assert {f"host.cpu{i}_pct" for i in range(n_cores)} <= set(src.units)
    _burn_cpu(0.2)
    v = src.sample()
    assert set(v) == set(src.units)
    assert all(0.0 <= v[k] <= 100.0 for k in v if k.startswith("host.cpu"))
    assert v["host.ram_total_bytes"] == psutil.virtual_memory().total
    assert 0 < v["host.ram_used_bytes"] < v["host.ram_total_bytes"]
    rss = psutil.Process().memory_info().rss
    assert 0.5 * rss < v["proc.rss_bytes"] < 2 * rss
    assert v["proc.cpu_pct"] > 10.0  # we just burned 0.2 s of CPU: not idle, whatever the load


class _ReplayedCpuTimes:
    """psutil's per-core cpu_times replayed from a list: the kernel's counter anomalies on demand."""

    def __init__(self, rows):
        self.rows = list(rows)

    def cpu_times(self, percpu):
        fields = psutil.cpu_times(percpu=True)[0]._fields  # the real record type of this kernel
        return [
            type(psutil.cpu_times(percpu=True)[0])(**dict(zip(fields, self._row(fields, r)))) for r in self.rows.pop(0)
        ]

    @staticmethod
    def _row(fields, r):
        return [r.get(f, 0.0) for f in fields]


def test_host_cpu_never_above_100_when_iowait_runs_backwards_nor_0_between_ticks():
    src = HostSource()
    src._psutil = _ReplayedCpuTimes(
        [
            [{"user": 10.0, "idle": 10.0, "iowait": 5.0}],
            [{"user": 10.5, "idle": 10.0, "iowait": 4.9}],  # iowait fell 0.1 s while user ran 0.5 s
            [{"user": 10.5, "idle": 10.0, "iowait": 4.9}],  # sampled again inside the same tick
            [{"user": 10.6, "idle": 10.3, "iowait": 4.9}],
        ]
    )
    src._last_times = src._core_times()
    first = src._cpu()
    assert first["host.cpu0_pct"] == 100.0 and first["host.cpu_pct"] == 100.0
    assert src._cpu() == first  # no tick passed: the last reading stands, not a false 0 %
    assert src._cpu()["host.cpu0_pct"] == pytest.approx(25.0)


def test_host_watches_another_pid_and_survives_its_exit(caplog):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        src = HostSource(pid=child.pid)
        src.open()
        assert src.sample()["proc.rss_bytes"] > 0
    finally:
        child.kill()
        child.wait()
    with caplog.at_level(logging.INFO):  # an exit is logged once, at INFO (not a fault: the monitor says so)
        after = [src.sample() for _ in range(3)]
    assert all("proc.rss_bytes" not in v and "host.cpu_pct" in v for v in after)
    assert sum(str(child.pid) in r.getMessage() for r in caplog.records) == 1


def test_mlx_allocator_counts_a_real_array():
    mx = pytest.importorskip("mlx.core")
    src = MlxSource()
    assert src.open(), src.reason
    before = src.sample()["mlx.active_bytes"]
    a = mx.ones((1024, 1024))  # 4 MiB of float32
    mx.eval(a)
    v = src.sample()
    assert v["mlx.active_bytes"] - before >= 4 * 2**20
    assert v["mlx.peak_bytes"] >= v["mlx.active_bytes"]
    del a
    assert not math.isnan(src.sample()["mlx.cache_bytes"])


def test_allocators_are_unavailable_until_their_framework_is_imported(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.delitem(sys.modules, "mlx.core", raising=False)
    for src in (TorchCudaSource(), MlxSource()):
        assert not src.open() and src.missing_package and "not imported" in src.reason
        assert src.sample() == {}
    assert "torch" not in sys.modules  # opening did not import it


@pytest.mark.slow
def test_torch_without_cuda_says_so():
    pytest.importorskip("torch")
    src = TorchCudaSource()
    import torch

    if torch.cuda.is_available():
        assert src.open() and "torch.cuda0.allocated_bytes" in src.units
    else:
        assert not src.open() and src.reason == "torch sees no CUDA device"


def test_default_sources_import_nothing_until_opened(monkeypatch):
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    names = [s.name for s in default_sources()]
    assert names == ["host", "nvml", "amdsmi", "apple", "torch", "mlx"]
    assert [s.name for s in default_sources(in_process=False)] == ["host", "nvml", "amdsmi", "apple"]
    assert "pynvml" not in sys.modules


def test_amdsmi_not_installed_is_quiet(monkeypatch):
    monkeypatch.setitem(sys.modules, "amdsmi", None)  # import amdsmi -> ImportError
    src = AmdSmiSource()
    assert not src.open() and src.missing_package
    assert src.reason == "no AMD GPU (amdsmi is not installed)"


class AmdSmiLibraryException(Exception):
    """Shape of amdsmi.AmdSmiLibraryException: built from a status code."""

    def __init__(self, err_code: int) -> None:
        super().__init__(err_code)
        self.err_code = err_code


def _fake_amdsmi(n_gpus: int, unsupported: tuple[str, ...] = ()) -> types.ModuleType:
    """The amdsmi 7.0 calls the source makes: dicts with amdsmi's keys and its "N/A" strings."""
    smi = types.ModuleType("amdsmi")
    smi.AmdSmiException = Exception
    smi.AmdSmiLibraryException = AmdSmiLibraryException
    smi.AmdSmiClkType = types.SimpleNamespace(GFX=1, MEM=5)
    smi.AmdSmiTemperatureType = types.SimpleNamespace(EDGE=0)
    smi.AmdSmiTemperatureMetric = types.SimpleNamespace(CURRENT=0)
    smi.shut_down = 0

    def call(name, fn):
        def wrapped(*args):
            if name in unsupported:
                raise AmdSmiLibraryException(2)  # AMDSMI_STATUS_NOT_SUPPORTED
            return fn(*args)

        setattr(smi, name, wrapped)

    call("amdsmi_init", lambda: None)
    call("amdsmi_shut_down", lambda: setattr(smi, "shut_down", smi.shut_down + 1))
    call("amdsmi_get_processor_handles", lambda: [object() for _ in range(n_gpus)])
    call("amdsmi_get_gpu_activity", lambda h: {"gfx_activity": 87, "umc_activity": 41, "mm_activity": "N/A"})
    call("amdsmi_get_gpu_vram_usage", lambda h: {"vram_total": 196592, "vram_used": 1024})
    call(
        "amdsmi_get_power_info",
        lambda h: {"current_socket_power": "N/A", "average_socket_power": 412, "power_limit": 750, "socket_power": 412},
    )
    call(
        "amdsmi_get_clock_info",
        lambda h, t: {
            "clk": 2100 if t == 1 else 1300,
            "min_clk": 500,
            "max_clk": 2100,
            "clk_locked": "N/A",
            "clk_deep_sleep": 0,
        },
    )
    call("amdsmi_get_temp_metric", lambda h, s, m: 55)
    call("amdsmi_get_gpu_process_list", lambda h: [{"name": "python", "pid": 1, "mem": 3 * 2**20}])
    return smi


def test_amd_gpus_map_amdsmi_fields_and_na(monkeypatch):
    smi = _fake_amdsmi(2, unsupported=("amdsmi_get_temp_metric",))
    monkeypatch.setitem(sys.modules, "amdsmi", smi)
    src = AmdSmiSource(pids={1})
    assert src.open()
    assert set(src.units) == {f"amd{i}.{k}" for i in (0, 1) for k in AMD_FIELDS}
    v = src.sample()
    assert (v["amd1.util_pct"], v["amd1.mem_util_pct"]) == (87.0, 41.0)
    assert v["amd0.mem_used_bytes"] == 1024 * 2**20 and v["amd0.mem_total_bytes"] == 196592 * 2**20
    assert v["amd0.power_w"] == 412.0  # "N/A" current power: falls back to the average
    assert (v["amd0.sm_clock_mhz"], v["amd0.mem_clock_mhz"]) == (2100.0, 1300.0)
    assert math.isnan(v["amd0.temp_c"]) and v["amd0.proc_mem_bytes"] == 3 * 2**20
    src.close()
    assert smi.shut_down == 1


@pytest.mark.skipif(sys.platform == "darwin", reason="the N/A statement is for other systems")
def test_apple_memory_is_stated_na_elsewhere():
    from opscope.engine.telemetry.apple import AppleMemorySource

    src = AppleMemorySource()
    assert not src.open() and src.sample() == {}
    assert src.reason == (
        f"process footprint and memory pressure: N/A on {sys.platform} "
        f"(macOS kernel counters; RSS is in the host series)"
    )


@pytest.mark.skipif(sys.platform != "darwin", reason="macOS kernel counters")
def test_apple_footprint_and_pressure_on_macos():
    from opscope.engine.telemetry.apple import AppleMemorySource

    src = AppleMemorySource()
    assert src.open()
    v = src.sample()
    assert v["apple.footprint_bytes"] > 1 << 20 and v["apple.memory_pressure"] in (1.0, 2.0, 4.0)
