"""The environment fingerprint: real probes on this machine, a fake NVML for the GPU fields."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import types

from opscope.engine.core import fingerprint


def test_collect_has_every_section_with_real_values():
    import torch

    fp = fingerprint.collect({"dtype": "bfloat16"})
    assert set(fp) >= {"host", "software", "torch", "git", "nvidia", "env", "settings"}
    assert fp["host"]["cpu_cores_logical"] >= 1 and fp["host"]["ram_bytes"] > 2**28
    assert fp["host"]["cpu_model"]
    assert fp["software"]["torch"] == torch.__version__
    assert fp["torch"]["threads"] == torch.get_num_threads()
    assert fp["settings"] == {"dtype": "bfloat16"}
    nv = fp["nvidia"]
    assert (nv["status"] == "ok") == bool(nv["gpus"])  # here: no driver, so a reason and no GPUs


class FakeNVML(types.ModuleType):
    """The subset of nvidia-ml-py (pynvml) the fingerprint calls, with its error types and units."""

    NVML_CLOCK_SM = 1

    class NVMLError(Exception):
        pass

    class NVMLError_NotSupported(NVMLError):
        pass

    def __init__(self, gpus):
        super().__init__("pynvml")
        self.gpus, self.shutdown = gpus, 0

    def nvmlInit(self):
        return None

    def nvmlShutdown(self):
        self.shutdown += 1

    def nvmlSystemGetDriverVersion(self):
        return "550.54.15"

    def nvmlSystemGetCudaDriverVersion(self):
        return 12040

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        return self.gpus[i]

    def nvmlDeviceGetName(self, h):
        return h["name"]

    def nvmlDeviceGetMemoryInfo(self, h):
        return types.SimpleNamespace(total=h["mem"], free=h["mem"], used=0)

    def nvmlDeviceGetPowerManagementLimit(self, h):
        if h.get("power_mw") is None:
            raise self.NVMLError_NotSupported("Not Supported")
        return h["power_mw"]

    def nvmlDeviceGetMaxClockInfo(self, h, clock):
        return 1980 if clock == self.NVML_CLOCK_SM else 0


def test_nvidia_fields_from_nvml(monkeypatch):
    fake = FakeNVML(
        [
            {"name": "NVIDIA H100 80GB HBM3", "mem": 80 * 2**30, "power_mw": 700_000},
            {"name": "NVIDIA L4", "mem": 24 * 2**30, "power_mw": None},
        ]
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    nv = fingerprint.nvidia_info()
    assert nv["status"] == "ok" and nv["driver"] == "550.54.15" and nv["cuda_driver"] == "12.4"
    assert nv["gpus"][0] == {
        "index": 0,
        "name": "NVIDIA H100 80GB HBM3",
        "memory_bytes": 80 * 2**30,
        "power_limit_w": 700.0,
        "sm_clock_max_mhz": 1980,
    }
    assert nv["gpus"][1]["power_limit_w"] is None  # unsupported field: None, not a failure
    assert fake.shutdown == 1


def test_no_driver_is_a_reason_not_an_error(monkeypatch):
    fake = FakeNVML([])

    def no_lib():
        raise fake.NVMLError("NVML Shared Library Not Found")

    fake.nvmlInit = no_lib
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert fingerprint.nvidia_info() == {"gpus": [], "status": "no NVIDIA GPU (NVML Shared Library Not Found)"}


def test_sha256_is_cached_by_path_mtime_and_size(tmp_path):
    f = tmp_path / "model.gguf"
    f.write_bytes(b"a" * 1000)
    assert fingerprint.file_sha256(f) == hashlib.sha256(b"a" * 1000).hexdigest()
    st = f.stat()
    f.write_bytes(b"b" * 1000)  # same size; restore the mtime: the cached hash is returned unread
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert fingerprint.file_sha256(f) == hashlib.sha256(b"a" * 1000).hexdigest()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # a new mtime: hashed again
    assert fingerprint.file_sha256(f) == hashlib.sha256(b"b" * 1000).hexdigest()


def _git(repo, *args):
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True, capture_output=True
    )


def test_git_commit_and_dirty_flag(tmp_path):
    assert fingerprint.git_info(tmp_path) is None  # not a checkout
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.txt").write_text("1")
    _git(tmp_path, "add", "a.txt")
    _git(tmp_path, "commit", "-q", "-m", "one")
    info = fingerprint.git_info(tmp_path)
    assert len(info["commit"]) == 40 and info["dirty"] is False
    (tmp_path / "a.txt").write_text("2")
    assert fingerprint.git_info(tmp_path)["dirty"] is True


def test_model_info_records_hash_and_quantization(tmp_path):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"x" * 10)
    src = types.SimpleNamespace(path=f, format="gguf", file_size_bytes=10, quant_summary={"Q4_1": 7}, config=None)
    info = fingerprint.model_info(src)
    assert info["sha256"] == hashlib.sha256(b"x" * 10).hexdigest() and info["quantization"] == {"Q4_1": 7}
