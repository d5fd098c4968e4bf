"""The environment a run was measured in, saved with every run so that two runs can be compared
knowing what differed: host, software versions, checkout, GPUs, the model file and every setting.

Every probe is best-effort: a field that cannot be read is recorded as None with no exception,
because a missing GPU or git is a normal state, not an error.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import platform
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from opscope.engine.core.paths import cache_dir

log = logging.getLogger(__name__)

_REPO_DIR = Path(__file__).resolve().parents[2]
_HASH_CACHE = "model_sha256.json"


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _source_version() -> str | None:
    """The version in pyproject.toml when running from a checkout that is not pip-installed."""
    import tomllib

    try:
        data = tomllib.loads((_REPO_DIR / "pyproject.toml").read_text())
    except (OSError, ValueError):
        return None
    version = data.get("project", {}).get("version")
    return f"{version} (source)" if version else None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if sys.platform == "darwin":
        out = _run(["sysctl", "-n", "machdep.cpu.brand_string"])
        if out:
            return out
    return platform.processor() or platform.machine()


def host_info() -> dict[str, Any]:
    import psutil

    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu_model": cpu_model(),
        "cpu_cores_logical": psutil.cpu_count(logical=True),
        "cpu_cores_physical": psutil.cpu_count(logical=False),
        "cpu_cores_usable": usable,
        "ram_bytes": psutil.virtual_memory().total,
        "os": platform.platform(),
        "machine": platform.machine(),
        "hostname": platform.node(),
    }


def software_info() -> dict[str, Any]:
    return {
        "python": platform.python_version(),
        "python_impl": platform.python_implementation(),
        "opscope": _version("opscope") or _source_version(),
        "torch": _version("torch"),
        "mlx": _version("mlx"),
        "numpy": _version("numpy"),
        "gguf": _version("gguf"),
    }


def torch_info() -> dict[str, Any]:
    """torch's build and the process-wide settings that change numbers."""
    import torch

    info = {
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "rocm": getattr(torch.version, "hip", None),
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "mkldnn": torch.backends.mkldnn.is_available(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }
    if torch.cuda.is_available():
        info["cuda_tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
        info["cuda_devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


def _run(cmd: list[str], cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=5, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def git_info(repo_dir: Path = _REPO_DIR) -> dict[str, Any] | None:
    """The checkout's commit and whether it has uncommitted changes; None outside a git checkout."""
    commit = _run(["git", "rev-parse", "HEAD"], repo_dir)
    if commit is None:
        return None
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], repo_dir)
    return {"commit": commit, "dirty": bool(status)}


def env_settings() -> dict[str, str]:
    """Environment variables that change how fast the same code runs."""
    names = (
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "CUDA_VISIBLE_DEVICES",
        "HIP_VISIBLE_DEVICES",
        "PYTORCH_CUDA_ALLOC_CONF",
        "CUBLAS_WORKSPACE_CONFIG",
        "TORCH_CUDNN_V8_API_ENABLED",
        "ATEN_CPU_CAPABILITY",
        "DNNL_MAX_CPU_ISA",
        "MLX_METAL_DEBUG",
    )
    return {n: os.environ[n] for n in names if n in os.environ}


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _nvml_field(fn: Callable[..., Any], *args: Any) -> Any:
    """One NVML query; a field the GPU or driver does not support is None, not a failure."""
    import pynvml

    try:
        return fn(*args)
    except pynvml.NVMLError:
        return None


def _nvml_gpu(pynvml: ModuleType, i: int) -> dict[str, Any]:
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    mem = _nvml_field(pynvml.nvmlDeviceGetMemoryInfo, h)
    limit_mw = _nvml_field(pynvml.nvmlDeviceGetPowerManagementLimit, h)
    return {
        "index": i,
        "name": _text(pynvml.nvmlDeviceGetName(h)),
        "memory_bytes": int(mem.total) if mem is not None else None,
        "power_limit_w": limit_mw / 1000 if limit_mw is not None else None,
        "sm_clock_max_mhz": _nvml_field(pynvml.nvmlDeviceGetMaxClockInfo, h, pynvml.NVML_CLOCK_SM),
    }


def nvidia_info() -> dict[str, Any]:
    """NVIDIA GPUs through NVML; on a machine without the driver, the reason instead."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except ImportError:
        return {"gpus": [], "status": "nvidia-ml-py not installed"}
    except Exception as e:  # NVMLError_LibraryNotFound, DriverNotLoaded...: the normal CPU machine
        return {"gpus": [], "status": f"no NVIDIA GPU ({_text(e)})"}
    try:
        cuda = _nvml_field(pynvml.nvmlSystemGetCudaDriverVersion)
        return {
            "gpus": [_nvml_gpu(pynvml, i) for i in range(pynvml.nvmlDeviceGetCount())],
            "driver": _text(pynvml.nvmlSystemGetDriverVersion()),
            "cuda_driver": f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None,
            "status": "ok",
        }
    except pynvml.NVMLError as e:
        return {"gpus": [], "status": f"NVML query failed ({_text(e)})"}
    finally:
        _nvml_field(pynvml.nvmlShutdown)


def file_sha256(path: str | Path) -> str:
    """SHA-256 of a model file, cached by (path, mtime, size): hashing 100 MB+ on every run is slow,
    and a changed file changes its mtime or size."""
    p = Path(path).resolve()
    st = p.stat()
    key = f"{p}|{st.st_mtime_ns}|{st.st_size}"
    cache_file = cache_dir() / _HASH_CACHE
    try:
        cache = json.loads(cache_file.read_text())
    except (OSError, ValueError):
        cache = {}
    if isinstance(cache.get(key), str):
        return str(cache[key])
    h = hashlib.sha256()
    with p.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    cache = {k: v for k, v in cache.items() if not k.startswith(f"{p}|")}
    digest = cache[key] = h.hexdigest()
    _write_json_atomic(cache_file, cache)
    return digest


def _write_json_atomic(path: Path, data: Any) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        os.replace(tmp, path)  # atomic: a concurrent reader sees the old or the new file
    except OSError as e:
        log.info("could not write cache %s: %s", path, e)


def model_info(source: Any) -> dict[str, Any]:
    """The model file's identity and quantization, from an engine.formats.ModelSource-like object."""
    path = Path(source.path)
    file = path if path.is_file() else None
    cfg = getattr(source, "config", None)
    return {
        "path": str(path),
        "format": getattr(source, "format", None),
        "sha256": file_sha256(file) if file else None,
        "file_size_bytes": getattr(source, "file_size_bytes", None),
        "quantization": getattr(source, "quant_summary", None),
        "config": cfg.shape_fields() if cfg is not None and hasattr(cfg, "shape_fields") else None,
    }


def collect(
    settings: dict[str, Any] | None = None, model_source: Any = None, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The whole fingerprint of this process, for one run."""
    fp: dict[str, Any] = {
        "host": host_info(),
        "software": software_info(),
        "torch": torch_info(),
        "git": git_info(),
        "nvidia": nvidia_info(),
        "env": env_settings(),
        "settings": dict(settings or {}),
    }
    if model_source is not None:
        fp["model"] = model_info(model_source)
    fp.update(extra or {})
    return fp
