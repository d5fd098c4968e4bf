"""Energy per token (issue 14 item 6): RAPL from a powercap tree laid out as the kernel does, NVML
through the telemetry tests' fake NVML (real pynvml module, real error types), and generation stats.

This machine has no /sys/class/powercap/intel-rapl:* (a VM): the real meter must say so."""

from __future__ import annotations

import math
import os
import threading
import time
from pathlib import Path

import pytest
from opscope.engine.telemetry import energy


def _zone(root: Path, name: str, label: str, uj: int, wrap: int = 262143328850) -> Path:
    z = root / name
    z.mkdir(parents=True)
    (z / "name").write_text(label + "\n")
    (z / "energy_uj").write_text(f"{uj}\n")
    (z / "max_energy_range_uj").write_text(f"{wrap}\n")
    return z


@pytest.fixture
def powercap(tmp_path, monkeypatch):
    """Two packages, each with a core sub-zone (inside the package figure), and an unrelated
    mmio zone, as /sys/class/powercap shows them on a two-socket Xeon."""
    root = tmp_path / "powercap"
    _zone(root, "intel-rapl:0", "package-0", 1_000_000)
    _zone(root, "intel-rapl:0:0", "core", 500_000)
    _zone(root, "intel-rapl:1", "package-1", 2_000_000, wrap=3_000_000)
    _zone(root, "intel-rapl-mmio:0", "package-0", 7)
    monkeypatch.setenv(energy.POWERCAP_ENV, str(root))
    energy.reset()
    yield root
    energy.reset()


def test_rapl_sums_packages_not_their_sub_zones_and_unwraps(powercap):
    m = energy.RaplMeter()
    assert m.available and [z.name for z in m.zones] == ["package-0", "package-1"]
    span = m.span()
    (powercap / "intel-rapl:0" / "energy_uj").write_text("3500000\n")  # +2.5 J
    (powercap / "intel-rapl:0:0" / "energy_uj").write_text("9000000\n")  # core: already in the package
    (powercap / "intel-rapl:1" / "energy_uj").write_text("500000\n")  # wrapped at 3 J: +1.5 J (incl. 1 µJ)
    assert span.joules() == pytest.approx(2.5 + 1.500001)


def test_the_real_machine_says_why_rapl_is_not_there(monkeypatch):
    monkeypatch.delenv(energy.POWERCAP_ENV, raising=False)
    if list(Path("/sys/class/powercap").glob("intel-rapl:*")):
        pytest.skip("this machine has RAPL; the fake-tree tests cover it")
    m = energy.RaplMeter()
    assert not m.available and m.read() is None and m.span().joules() is None
    assert "no RAPL energy counters" in m.reason and "N/A" in m.reason


def test_an_empty_powercap_root_is_n_a_with_the_reason(tmp_path):
    m = energy.RaplMeter(tmp_path)
    assert not m.available and str(tmp_path) in m.reason


class _Heater(threading.Thread):
    """Writes package-0's counter as a 10 W load would, every millisecond."""

    WATTS = 10.0

    def __init__(self, zone: Path) -> None:
        super().__init__(daemon=True)
        self.zone, self.stop = zone, threading.Event()
        self.t0 = time.monotonic()

    def run(self) -> None:
        while not self.stop.wait(0.001):
            uj = 1_000_000 + int((time.monotonic() - self.t0) * self.WATTS * 1e6)
            tmp = self.zone / "energy_uj.tmp"
            tmp.write_text(f"{uj}\n")
            os.replace(tmp, self.zone / "energy_uj")  # a sysfs read never sees half a number


@pytest.mark.usefixtures("one_torch_thread")
def test_generation_stats_carry_joules_per_token_from_rapl(powercap, lm):
    from opscope.engine.generation.events import Finished
    from opscope.engine.generation.generate import GenerationConfig

    for extra in ("intel-rapl:1", "intel-rapl:0:0"):
        import shutil

        shutil.rmtree(powercap / extra)
    heater = _Heater(powercap / "intel-rapl:0")
    heater.start()
    try:
        cfg = GenerationConfig(max_tokens=8, temperature=0.0, ignore_eos=True, reuse_prefix=False)
        stats = next(ev.stats for ev in lm.generate(list(range(1, 33)), cfg) if isinstance(ev, Finished))
    finally:
        heater.stop.set()
        heater.join()
    assert stats.energy_source == "RAPL"
    # 10 W over the prefill, per prefilled token; over the decode, per token after the first
    want_prefill = _Heater.WATTS * stats.prefill_ms / 1e3 / stats.prompt_tokens
    want_decode = _Heater.WATTS * (stats.total_ms - stats.ttft_ms) / 1e3 / (stats.generated_tokens - 1)
    assert stats.prefill_j_per_token == pytest.approx(want_prefill, rel=0.3, abs=2e-3)
    assert stats.decode_j_per_token == pytest.approx(want_decode, rel=0.3, abs=2e-3)
    assert stats.as_dict()["decode_j_per_token"] == stats.decode_j_per_token


@pytest.mark.usefixtures("one_torch_thread")
def test_batch_generation_carries_joules_per_token_over_real_tokens(powercap, lm):
    """Two rows of 20 and 8 prompt tokens: prefill joules over the 28 prompt tokens (not the 40
    padded positions), decode joules over the tokens the rows decoded after their first."""
    import shutil

    from opscope.engine.generation.events import Finished, Token
    from opscope.engine.generation.generate import GenerationConfig

    for extra in ("intel-rapl:1", "intel-rapl:0:0"):
        shutil.rmtree(powercap / extra)
    heater = _Heater(powercap / "intel-rapl:0")
    heater.start()
    try:
        cfg = GenerationConfig(max_tokens=6, temperature=0.0, ignore_eos=True, reuse_prefix=False)
        events = list(lm.generate_batch([list(range(1, 21)), list(range(30, 38))], cfg))
    finally:
        heater.stop.set()
        heater.join()
    stats = next(ev.stats for ev in events if isinstance(ev, Finished))
    tokens = sum(isinstance(ev, Token) for ev in events)
    assert tokens == 12 and stats.energy_source == "RAPL"
    want_prefill = _Heater.WATTS * stats.prefill_ms / 1e3 / 28
    want_decode = _Heater.WATTS * (stats.total_ms - stats.ttft_ms) / 1e3 / (tokens - 2)
    assert stats.prefill_j_per_token == pytest.approx(want_prefill, rel=0.3, abs=2e-3)
    assert stats.decode_j_per_token == pytest.approx(want_decode, rel=0.3, abs=2e-3)


@pytest.mark.usefixtures("one_torch_thread")
def test_batch_generation_without_a_counter_says_n_a(tmp_path, monkeypatch, lm):
    from opscope.engine.generation.events import Finished
    from opscope.engine.generation.generate import GenerationConfig

    monkeypatch.setenv(energy.POWERCAP_ENV, str(tmp_path / "nothing"))
    energy.reset()
    cfg = GenerationConfig(max_tokens=2, temperature=0.0, ignore_eos=True, reuse_prefix=False)
    stats = next(ev.stats for ev in lm.generate_batch([[1, 2, 3], [4, 5]], cfg) if isinstance(ev, Finished))
    energy.reset()
    assert math.isnan(stats.prefill_j_per_token) and math.isnan(stats.decode_j_per_token)
    assert stats.energy_source.startswith("N/A: no RAPL energy counters")


@pytest.mark.usefixtures("one_torch_thread")
def test_generation_without_a_counter_says_n_a_and_why(tmp_path, monkeypatch, lm):
    from opscope.engine.generation.events import Finished
    from opscope.engine.generation.generate import GenerationConfig

    monkeypatch.setenv(energy.POWERCAP_ENV, str(tmp_path / "nothing"))
    energy.reset()
    cfg = GenerationConfig(max_tokens=3, temperature=0.0, ignore_eos=True, reuse_prefix=False)
    stats = next(ev.stats for ev in lm.generate([1, 2, 3], cfg) if isinstance(ev, Finished))
    energy.reset()
    assert math.isnan(stats.prefill_j_per_token) and math.isnan(stats.decode_j_per_token)
    assert stats.energy_source.startswith("N/A: no RAPL energy counters")


# --- NVML -------------------------------------------------------------------------------------


def _fake_nvml(monkeypatch, total_mj: list[int] | None, unsupported=()):
    pynvml = pytest.importorskip("pynvml")
    from fake_nvml import FakeGpu, FakeNvml

    class FakeWithEnergy(FakeNvml):
        def nvmlDeviceGetTotalEnergyConsumption(self, h):
            self._gpu(h, "nvmlDeviceGetTotalEnergyConsumption")  # NVML's errors for a lost GPU
            return pynvml.c_ulonglong(total_mj.pop(0)).value  # mJ since the driver loaded

    gpu = FakeGpu("NVIDIA H100 80GB HBM3", unsupported=tuple(unsupported))
    return FakeWithEnergy([gpu]).install(monkeypatch), gpu


def test_nvml_total_energy_counter_in_millijoules(monkeypatch):
    fake, _ = _fake_nvml(monkeypatch, [5_000, 5_000, 12_500])
    m = energy.NvmlEnergyMeter(0)
    try:
        assert m.available and m.source == "NVML total energy"  # the probe read 5000 mJ
        span = m.span()
        assert span.joules() == pytest.approx(7.5)
    finally:
        m.close()
    assert fake.initialized == 0


def test_nvml_without_total_energy_integrates_power(monkeypatch):
    fake, gpu = _fake_nvml(monkeypatch, [], unsupported=("nvmlDeviceGetTotalEnergyConsumption",))
    gpu.power_mw = [200_000]  # 200 W, constant
    clock = iter([0.0, 0.5, 1.5]).__next__
    m = energy.NvmlEnergyMeter(0, period_s=0, clock=clock)  # no thread: samples only on read
    try:
        assert m.available and m.source == "NVML power, integrated"
        span = m.span()  # t=0
        m.read()  # t=0.5
        assert span.joules() == pytest.approx(200 * 1.5)  # t=1.5
    finally:
        m.close()


def test_nvml_with_neither_counter_is_n_a(monkeypatch):
    _fake_nvml(monkeypatch, [], unsupported=("nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetPowerUsage"))
    m = energy.NvmlEnergyMeter(0)
    assert not m.available and "neither total energy nor power" in m.reason
    m.close()


def _two_gpus_with_energy(monkeypatch):
    """Two GPUs whose total-energy counters differ, so a test sees which one a meter reads."""
    pynvml = pytest.importorskip("pynvml")
    from fake_nvml import FakeGpu, FakeNvml

    class FakeWithEnergy(FakeNvml):
        def nvmlDeviceGetTotalEnergyConsumption(self, h):
            self._gpu(h, "nvmlDeviceGetTotalEnergyConsumption")
            return pynvml.c_ulonglong((h.index + 1) * 1_000_000).value  # gpu0: 1 kJ, gpu1: 2 kJ

    FakeWithEnergy([FakeGpu("NVIDIA H100 80GB HBM3"), FakeGpu("NVIDIA H100 80GB HBM3")]).install(monkeypatch)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    energy.reset()


def _joules_read_for(device: str) -> float | None:
    meter = energy.meter_for(device)
    try:
        return meter.read()
    finally:
        energy.reset()


def test_cuda_visible_devices_by_uuid_reads_that_gpu(monkeypatch):
    from fake_nvml import fake_uuid

    _two_gpus_with_energy(monkeypatch)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", fake_uuid(1))  # what nvitop and Slurm hand out
    assert _joules_read_for("cuda:0") == pytest.approx(2000.0)  # NVML's gpu1, not its gpu0
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    assert _joules_read_for("cuda:0") == pytest.approx(2000.0)


def test_cuda_device_is_mapped_through_the_uuid_torch_reports(monkeypatch):
    """Under CUDA_DEVICE_ORDER=FASTEST_FIRST (CUDA's default) cuda:0 need not be NVML's 0: the
    UUID torch reports for cuda:0 names the device, as nvitop maps it."""
    import types

    import torch
    from fake_nvml import fake_uuid

    _two_gpus_with_energy(monkeypatch)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    cuda_uuids = {0: fake_uuid(1)[len("GPU-") :], 1: fake_uuid(0)[len("GPU-") :]}  # torch prints no prefix
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(uuid=cuda_uuids[i]))
    assert _joules_read_for("cuda:0") == pytest.approx(2000.0)
    assert _joules_read_for("cuda:1") == pytest.approx(1000.0)


def test_no_nvidia_driver_here_is_n_a_with_the_reason():
    pytest.importorskip("pynvml")
    m = energy.NvmlEnergyMeter(0)
    try:
        assert not m.available and m.reason.startswith("GPU energy N/A: NVML")
    finally:
        m.close()


def test_the_chat_stats_line_shows_joules_per_token_or_n_a():
    from opscope.app.chat.session import format_stats

    stats = {
        "ttft_ms": 40.0,
        "prefill_tok_s": 300.0,
        "decode_tok_s": 20.0,
        "prompt_tokens": 20,
        "generated_tokens": 8,
        "prefill_j_per_token": 0.0123,
        "decode_j_per_token": 0.5,
        "energy_source": "RAPL",
    }
    assert "20 prompt + 8 generated tokens · 0.0123 J/tok prefill, 0.5 J/tok decode · stop: eos" in format_stats(
        stats, "eos"
    )
    na = {
        **stats,
        "prefill_j_per_token": float("nan"),
        "energy_source": "N/A: no RAPL energy counters (/x/intel-rapl:* absent: a VM); CPU energy is N/A",
    }
    assert format_stats(na, "eos").endswith("generated tokens · energy N/A (no RAPL energy counters) · stop: eos")


# --- exact J/token through the CLI and the plugin loop -------------------------------------------
# package-0's counter advances at the phase markers, which every loop emits in its own thread right
# after it read the counter for the phase before: +2 J when the prefill starts, +0.5 J when the
# decode starts. So the prefill spent exactly 2 J and the decode 0.5 J.
COUNTER_AT = {("prefill", "start"): 3_000_000, ("decode", "start"): 3_500_000}


@pytest.fixture
def counter_at_markers(tmp_path, monkeypatch):
    from opscope.engine.core import markers

    root = tmp_path / "powercap"
    zone = _zone(root, "intel-rapl:0", "package-0", 1_000_000)
    written = []

    def advance(m) -> None:
        uj = COUNTER_AT.get((m.phase, m.edge))
        if uj is not None:
            (zone / "energy_uj").write_text(f"{uj}\n")
            written.append(uj)

    monkeypatch.setenv(energy.POWERCAP_ENV, str(root))
    energy.reset()
    unsubscribe = markers.subscribe(advance)
    yield written
    unsubscribe()
    energy.reset()


@pytest.mark.usefixtures("one_torch_thread")
def test_opscope_generate_prints_the_exact_joules_per_token(counter_at_markers, capsys, monkeypatch):
    import re

    from opscope.engine.cli.commands import generate
    from opscope.engine.cli.main import main

    class QuietHost:  # no other process on the CPU: the line ends with the energy (no "disturbed" note)
        def cores(self) -> float:
            return 0.0

    monkeypatch.setattr(generate, "OtherLoad", QuietHost)

    assert main(["generate", "The capital of France is", "-n", "5", "--ignore-eos", "--threads", "1"]) == 0
    line = capsys.readouterr().err.strip().splitlines()[-1]
    prompt = int(re.search(r"prompt (\d+) tok", line).group(1))
    assert "generated 5 tok" in line
    assert line.endswith(f"· {2.0 / prompt:.3g} J/tok prefill, {0.5 / 4:.3g} J/tok decode (RAPL)"), line
    assert counter_at_markers == [3_000_000, 3_500_000]


def test_the_plugin_loop_puts_exact_joules_per_token_in_finished(counter_at_markers, lm):
    from opscope.engine.backends import stream_generation
    from opscope.engine.generation.config import GenerationConfig
    from opscope.engine.generation.events import Finished

    class Constant:  # a backend whose model always answers token 42
        def forward(self, ids):
            pass

        def sample(self):
            return 42

    cfg = GenerationConfig(max_tokens=6, ignore_eos=True)
    done = [ev for ev in stream_generation(Constant(), lm.tokenizer, [1, 2, 3, 4], cfg) if isinstance(ev, Finished)][0]
    assert done.stats.energy_source == "RAPL"
    assert done.stats.prefill_j_per_token == pytest.approx(2.0 / 4)
    assert done.stats.decode_j_per_token == pytest.approx(0.5 / 5)


def test_the_stats_line_says_why_energy_is_n_a(tmp_path, monkeypatch):
    from opscope.engine.cli.commands.generate import summary_line
    from opscope.engine.generation.events import GenerationStats

    monkeypatch.setenv(energy.POWERCAP_ENV, str(tmp_path / "nothing"))
    energy.reset()
    try:
        reason = energy.source_of(energy.meter_for("cpu"))
    finally:
        energy.reset()
    stats = GenerationStats(10, 5, 40.0, 30.0, 333.0, 20.0, 300.0, energy_source=reason)
    assert summary_line(stats).endswith(
        f"decode 20.0 tok/s · energy N/A: no RAPL energy counters ({tmp_path}"
        f"/nothing/intel-rapl:* absent: a VM or a CPU without RAPL); CPU energy is N/A"
    )
