"""The torch backend plugin: device listing (CUDA, ROCm, CPU-only), op hook, benchmark primitives.

No GPU is here: the CUDA/ROCm cases replace torch's own query functions with fakes that return
what torch returns on such machines (ROCm builds report AMD GPUs through torch.cuda, with
torch.version.hip set and torch.version.cuda None).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from opscope.engine.backends import OpEvent, get_backend
from opscope.engine.core.errors import ConfigError, DeviceError
from opscope.plugins.torch_backend import TorchBackend
from opscope.plugins.torch_backend.devices import torch_devices


def fake_gpus(monkeypatch, *, hip: str | None, cuda: str | None, names: list[str]):
    monkeypatch.setattr(torch.version, "hip", hip)
    monkeypatch.setattr(torch.version, "cuda", cuda)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: bool(names))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(names))
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda i: SimpleNamespace(name=names[i], total_memory=(64 << 30) * (i + 1))
    )


def test_rocm_gpus_present_as_cuda_and_are_labelled_rocm(monkeypatch):
    fake_gpus(monkeypatch, hip="6.2.41133", cuda=None, names=["AMD Instinct MI300X", "AMD Radeon PRO W7900"])
    devices = {d.name: d for d in torch_devices()}
    assert devices["cuda:0"].kind == "rocm" and devices["cuda:1"].kind == "rocm"
    assert devices["cuda:0"].description == "AMD Instinct MI300X (ROCm 6.2.41133)"
    assert devices["cuda:1"].memory_bytes == 128 << 30


def test_nvidia_gpus_are_labelled_cuda(monkeypatch):
    fake_gpus(monkeypatch, hip=None, cuda="12.8", names=["NVIDIA H100 80GB HBM3"])
    devices = {d.name: d for d in torch_devices()}
    assert devices["cuda:0"].kind == "cuda" and devices["cuda:0"].available
    assert "CUDA 12.8" in devices["cuda:0"].description


def test_gpu_build_without_a_visible_gpu_says_why(monkeypatch):
    fake_gpus(monkeypatch, hip=None, cuda="12.8", names=[])
    (gpu,) = [d for d in torch_devices() if d.name != "cpu"]
    assert not gpu.available and "no NVIDIA GPU visible" in gpu.reason


def test_cpu_only_build_here_says_so():
    devices = {d.name: d for d in torch_devices()}
    assert devices["cpu"].available
    if torch.version.cuda is None and torch.version.hip is None:
        assert not devices["cuda"].available and "CPU-only build" in devices["cuda"].reason


def test_load_rejects_unknown_options_and_devices():
    with pytest.raises(ConfigError, match="unknown option"):
        TorchBackend().load(None, flash=True)
    with pytest.raises(DeviceError):
        TorchBackend().load(None, device="cuda:7")


def test_trace_hook_reports_aten_ops_with_devices_and_shapes():
    events: list[OpEvent] = []
    layer = torch.nn.Linear(8, 4)
    with get_backend("torch").trace_ops(events.append):
        layer(torch.ones(2, 8)).sum().item()
    ops = [e.op for e in events]
    assert "addmm" in ops and "_local_scalar_dense" in ops  # the .item() sync is visible
    addmm = events[ops.index("addmm")]
    assert addmm.device == "cpu" and addmm.output_shapes == ((2, 4),) and addmm.input_dtypes[0] == "float32"


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_benchmark_primitives_time_every_iteration(backend):
    b = get_backend(backend)
    matmul = b.bench_matmul(64, 64, 64, device="cpu", dtype="float32", iterations=3)
    copy = b.bench_copy(1 << 16, device="cpu", iterations=2)
    assert len(matmul) == 3 and len(copy) == 2
    assert all(isinstance(t, int) and t > 0 for t in matmul + copy)
    with pytest.raises(ConfigError):
        b.bench_copy(16, device="cpu", iterations=0)
