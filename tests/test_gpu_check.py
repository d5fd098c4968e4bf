"""The first-contact GPU check (packaging/gpu_check, docs/gpu.md) kept from rotting on a machine
without a GPU: its dry run end to end, its verdict on a machine that has no GPU, the figures it
judges, and the size of the tree a GPU machine would be sent."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RUN = REPO / "packaging" / "gpu_check" / "run.py"
CARRY_LIMIT_BYTES = 64 * 2**20  # the device tool's limit on what travels (tracked files + carried .whl)
WHEELS_ALLOWANCE_BYTES = 8 * 2**20  # `make gpu-wheels` saves ~5.3 MB; counted where .whl is absent


def _run(out: Path, *flags: str, timeout_s: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(RUN), "--out", str(out), *flags],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=REPO,
    )


@pytest.fixture
def gpu_check(monkeypatch):
    """The check's modules (a script folder, not a package) importable for the duration of a test."""
    monkeypatch.syspath_prepend(str(RUN.parent))
    import bench_checks
    import harness

    return harness, bench_checks


@pytest.mark.slow
def test_the_dry_run_runs_what_needs_no_gpu_and_lists_the_rest_as_skipped(tmp_path):
    proc = _run(tmp_path / "out", "--dry", timeout_s=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    status = {c["name"]: c["status"] for c in report["checks"]}
    assert (
        proc.stderr.splitlines()[-2]
        == report["verdict"]
        == (
            f"gpu-check: ok: {list(status.values()).count('pass')} passed, {list(status.values()).count('skip')} skipped"
        )
    )
    ran = {
        "setup",
        "environment",
        "models-tiny",
        "cpu-reference",
        "logits",
        "trace-clean",
        "trace-leaky-norm",
        "trace-slow-train",
        "trace-fast-train",
        "generate-nproc1",
        "models-large",
        "decode-steps",
        "store-compare",
        "bench-collectives",
    }
    assert {n for n, s in status.items() if s == "pass"} == ran
    skipped = [c for c in report["checks"] if c["status"] == "skip"]
    assert {c["name"] for c in skipped} >= {
        "generate-cuda-float32",
        "generate-compile-decode",
        "bench-matmul",
        "bench-llm-telemetry",
        "energy",
        "bench-crossover",
    }
    assert all(c["reason"] == "dry run: needs a CUDA GPU (this run is on the CPU)" for c in skipped)
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| generate-cuda-float32 | skip |" in md and "| trace-leaky-norm | pass |" in md
    leaky = next(c for c in report["checks"] if c["name"] == "trace-leaky-norm")["figures"]
    assert leaky["expected_line"].startswith("engine/trace/planted.py:") and leaky["transfers_per_token"]["D2H"] >= 1
    assert (tmp_path / "out" / "logs" / "trace-leaky-norm.log").read_text().startswith("$ python -m opscope")


def test_on_a_machine_without_a_gpu_the_real_run_fails_and_names_the_check(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the real run's environment check passes here")
    proc = _run(tmp_path / "out", "--only", "environment", timeout_s=120)
    assert proc.returncode == 1
    assert "gpu-check: FAILED: environment" in proc.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    env = next(c for c in report["checks"] if c["name"] == "environment")
    assert env["reason"].startswith("torch sees no CUDA device") and report["exit_code"] == 1
    assert "| environment | fail |" in (tmp_path / "out" / "report.md").read_text()


def test_the_tree_a_gpu_machine_is_sent_fits_its_limit():
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout: what travels is what git tracks")
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    files = [REPO / p for p in listed.split("\0") if p]
    tree = sum(f.stat().st_size for f in files if f.is_file() and not f.is_symlink())
    whl = REPO / ".whl"
    wheels = sum(f.stat().st_size for f in whl.glob("*.whl")) if whl.is_dir() else WHEELS_ALLOWANCE_BYTES
    assert tree + wheels < CARRY_LIMIT_BYTES, f"{tree / 2**20:.1f} MiB tree + {wheels / 2**20:.1f} MiB wheels"


def test_the_scratch_install_exposes_the_builtin_backends_by_entry_point(tmp_path, gpu_check):
    """Where opscope is not installed (the GPU image), the registry still finds its plugins."""
    import importlib.metadata

    harness, _ = gpu_check
    harness._write_dist_info(REPO, tmp_path)
    dists = list(importlib.metadata.distributions(path=[str(tmp_path)]))
    eps = {ep.name: ep.value for d in dists for ep in d.entry_points if ep.group == "opscope.backends"}
    assert [d.metadata["Name"] for d in dists] == ["opscope"]
    assert eps["torch"] == "opscope.plugins.torch_backend:TorchBackend"


def test_a_missing_module_without_its_wheel_says_to_run_make_gpu_wheels(tmp_path, gpu_check):
    harness, _ = gpu_check
    ctx = harness.Ctx(tmp_path, REPO, sys.executable, dry=True, budget_s=60)
    with pytest.raises(harness.CheckFailed, match=r"^gguf not importable and no wheel for it in .*make gpu-wheels"):
        harness._install_wheels(ctx, ["gguf"], tmp_path / "no-wheels", tmp_path / "site")


def test_nvml_and_nvidia_smi_disagreeing_is_named(gpu_check):
    _, checks = gpu_check
    nvml = [
        {
            "gpu0.mem_used_bytes": 10 * 2**30,
            "gpu0.mem_total_bytes": 80 * 2**30,
            "gpu0.power_w": 400.0,
            "gpu0.power_limit_w": 700.0,
            "gpu0.sm_clock_mhz": 1980.0,
            "gpu0.mem_clock_mhz": 2619.0,
            "gpu0.temp_c": 50.0,
            "gpu0.util_pct": 100.0,
            "gpu0.pcie_tx_bytes_s": 1e6,
            "gpu0.pcie_rx_bytes_s": 1e6,
            "gpu0.clock_event_reasons": 0.0,
            "gpu0.proc_mem_bytes": 9 * 2**30,
        }
    ] * 20
    smi = [
        {
            "memory.used": 10240.0,
            "memory.total": 81920.0,
            "power.draw": 150.0,
            "power.limit": 700.0,
            "clocks.sm": 1980.0,
            "clocks.mem": 2619.0,
            "temperature.gpu": 51.0,
            "utilization.gpu": 98.0,
        }
    ] * 10
    out = checks.compare_telemetry(nvml, smi, "4242, 9216\n", 4242)
    assert out["disagree"] == ["gpu0.power_w 400 vs power.draw 150"]
    assert out["nvidia_smi_app_mib"] == 9216 and out["pairs"]["gpu0.temp_c"] == {"nvml": 50.0, "nvidia_smi": 51.0}


def test_rates_are_read_in_their_units(gpu_check):
    _, checks = gpu_check
    assert checks.per_second(3.0, "TB/s") == 3e12 and checks.per_second(790.0, "TFLOP/s") == 7.9e14
    assert checks.per_second(1.0, "GiB/s") == 2**30
