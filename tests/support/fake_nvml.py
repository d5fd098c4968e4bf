"""A fake NVML for tests: the pynvml calls NvmlSource makes, installed into the real ``pynvml``
module (monkeypatched functions, real ctypes structs, real NVMLError subclasses)."""

from __future__ import annotations

import pytest

pynvml = pytest.importorskip("pynvml")

MiB = 1024 * 1024


def _err(code: int) -> Exception:
    return pynvml.NVMLError(code)  # the real factory: returns e.g. NVMLError_NotSupported


class FakeHandle:
    def __init__(self, index: int) -> None:
        self.index = index


class FakeGpu:
    """One device. Values are lists indexed by tick (the tick advances on each utilization read,
    the first call the source makes per tick); the last value repeats."""

    def __init__(
        self,
        name: str,
        unsupported: tuple[str, ...] = (),
        lost_at_tick: int | None = None,
        procs: tuple[tuple[int, int | None], ...] = (),
    ) -> None:
        self.name, self.unsupported, self.lost_at_tick = name, set(unsupported), lost_at_tick
        self.procs = procs
        self.tick = -1
        self.util = [(50, 20), (75, 30), (100, 40)]
        self.power_mw = [100_000, 200_000, 300_000]
        self.mem_used = [1024 * MiB, 2048 * MiB]


class FakeNvml:
    """The pynvml calls NvmlSource makes, with the real library's types and errors."""

    def __init__(self, gpus: list[FakeGpu], init_error: int | None = None, old_driver: bool = False) -> None:
        self.gpus, self.init_error, self.old_driver = gpus, init_error, old_driver
        self.initialized = 0
        self.calls: dict[str, int] = {}

    def install(self, monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
        for name in dir(self):
            if name.startswith("nvml"):
                monkeypatch.setattr(pynvml, name, getattr(self, name))
        return self

    # library
    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise _err(self.init_error)
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self._check_init()
        self.initialized -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._check_init()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._check_init()
        if not 0 <= index < len(self.gpus):
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return FakeHandle(index)

    # device queries
    def nvmlDeviceGetName(self, h: FakeHandle) -> str:
        return self._gpu(h, "nvmlDeviceGetName").name

    def nvmlDeviceGetUUID(self, h: FakeHandle) -> str:
        self._gpu(h, "nvmlDeviceGetUUID")
        return fake_uuid(h.index)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> FakeHandle:
        self._check_init()  # the real call: NVML_ERROR_NOT_FOUND for a UUID no device has
        for index in range(len(self.gpus)):
            if fake_uuid(index) == uuid:
                return FakeHandle(index)
        raise _err(pynvml.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetUtilizationRates(self, h: FakeHandle):
        gpu = self.gpus[h.index]
        gpu.tick += 1
        gpu = self._gpu(h, "nvmlDeviceGetUtilizationRates")
        g, m = _at(gpu.util, gpu.tick)
        return pynvml.c_nvmlUtilization_t(gpu=g, memory=m)

    def nvmlDeviceGetMemoryInfo(self, h: FakeHandle, version=None):
        gpu = self._gpu(h, "nvmlDeviceGetMemoryInfo")
        used, total = _at(gpu.mem_used, gpu.tick), 80 * 1024 * MiB
        return pynvml.c_nvmlMemory_t(total=total, free=total - used, used=used)

    def nvmlDeviceGetPowerUsage(self, h: FakeHandle) -> int:
        gpu = self._gpu(h, "nvmlDeviceGetPowerUsage")
        return _at(gpu.power_mw, gpu.tick)

    def nvmlDeviceGetEnforcedPowerLimit(self, h: FakeHandle) -> int:
        self._gpu(h, "nvmlDeviceGetEnforcedPowerLimit")
        return 700_000

    def nvmlDeviceGetTemperature(self, h: FakeHandle, sensor: int) -> int:
        self._gpu(h, "nvmlDeviceGetTemperature")
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise _err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return 61

    def nvmlDeviceGetClockInfo(self, h: FakeHandle, clock_type: int) -> int:
        self._gpu(h, "nvmlDeviceGetClockInfo")
        return {pynvml.NVML_CLOCK_SM: 1980, pynvml.NVML_CLOCK_MEM: 2619}[clock_type]

    def nvmlDeviceGetPcieThroughput(self, h: FakeHandle, counter: int) -> int:
        self._gpu(h, "nvmlDeviceGetPcieThroughput")
        return {pynvml.NVML_PCIE_UTIL_TX_BYTES: 1000, pynvml.NVML_PCIE_UTIL_RX_BYTES: 2000}[counter]  # KB/s

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: FakeHandle) -> int:
        if self.old_driver:  # the symbol is missing from drivers before r535
            raise _err(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        self._gpu(h, "nvmlDeviceGetCurrentClocksEventReasons")
        return pynvml.nvmlClocksEventReasonSwPowerCap

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: FakeHandle) -> int:
        self._gpu(h, "nvmlDeviceGetCurrentClocksThrottleReasons")
        return pynvml.nvmlClocksThrottleReasonHwThermalSlowdown

    def nvmlDeviceGetComputeRunningProcesses(self, h: FakeHandle):
        gpu = self._gpu(h, "nvmlDeviceGetComputeRunningProcesses")
        return [
            pynvml.nvmlFriendlyObject(
                {"pid": pid, "usedGpuMemory": used, "gpuInstanceId": 0xFFFFFFFF, "computeInstanceId": 0xFFFFFFFF}
            )
            for pid, used in gpu.procs
        ]

    def _check_init(self) -> None:
        if self.initialized <= 0:
            raise _err(pynvml.NVML_ERROR_UNINITIALIZED)

    def _gpu(self, h: FakeHandle, func: str) -> FakeGpu:
        self._check_init()
        self.calls[func] = self.calls.get(func, 0) + 1
        gpu = self.gpus[h.index]
        if gpu.lost_at_tick is not None and gpu.tick >= gpu.lost_at_tick:
            raise _err(pynvml.NVML_ERROR_GPU_IS_LOST)
        if func in gpu.unsupported:
            raise _err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu


def fake_uuid(index: int) -> str:
    """NVML's form ("GPU-" + the CUDA UUID torch prints) for fake device ``index``."""
    return f"GPU-{index:08x}-1111-2222-3333-444444444444"


def _at(values: list, i: int):
    return values[min(max(i, 0), len(values) - 1)]
