"""`opscope chat`'s lines after each reply (issue 31 item 3): the prompt's cached tokens named, the
reason energy is N/A said once, and on a terminal the prompt progress and decode rate live on stderr."""

from __future__ import annotations

import io
import re
import sys

import pytest
from opscope.engine.cli.commands.generate import chat_with
from opscope.engine.cli.main import build_parser
from opscope.engine.telemetry import energy

pytestmark = pytest.mark.usefixtures("one_torch_thread", "quiet_host")


class _Load:
    """engine.core.cpuload.OtherLoad with a fixed reading: the busy cores of other processes."""

    cores_busy: float | None = 0.0

    def cores(self) -> float | None:
        return self.cores_busy


@pytest.fixture
def quiet_host(monkeypatch):
    """No other process on the CPU (the suite's other worker would otherwise be one)."""
    from opscope.engine.cli.commands import generate

    monkeypatch.setattr(_Load, "cores_busy", 0.0)
    monkeypatch.setattr(generate, "OtherLoad", _Load)


class Terminal(io.StringIO):
    """What a terminal receives (the escape sequences included)."""

    def isatty(self) -> bool:
        return True


@pytest.fixture
def no_energy(tmp_path, monkeypatch):
    monkeypatch.setenv(energy.POWERCAP_ENV, str(tmp_path / "nothing"))
    energy.reset()
    yield energy.source_of(energy.meter_for("cpu"))
    energy.reset()


def _chat(monkeypatch, lm, lines: str, err) -> tuple[str, str]:
    from opscope.engine.generation import prefix_cache

    prefix_cache.forget(lm.model)  # the first turn starts cold whatever ran before
    args = build_parser(argv=["chat"]).parse_args(["chat", "--max-tokens", "6", "--temperature", "0"])
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdin", io.StringIO(lines))
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", err)
    assert chat_with(lm, args) == 0
    return out.getvalue(), err.getvalue()


def test_stats_line_names_cached_tokens_and_says_why_energy_is_n_a_once(monkeypatch, lm, no_energy):
    _, err = _chat(monkeypatch, lm, "Hi there\nAnd then?\n\n", io.StringIO())
    stats = [ln for ln in err.splitlines() if ln.startswith("[")]
    assert len(stats) == 2
    assert "\x1b" not in err  # not a terminal: no live status
    first = re.match(r"\[\w+\] prompt (\d+) tok · generated", stats[0])
    second = re.match(r"\[\w+\] prompt (\d+) tok \((\d+) cached\) · generated", stats[1])
    assert first and second and 0 < int(second[2]) < int(second[1])  # turn 2 reuses turn 1's prefix
    assert stats[0].endswith(f"· energy N/A: {no_energy.removeprefix('N/A:').strip()}")
    assert stats[1].endswith(" tok/s · energy N/A")


def test_a_terminal_sees_prompt_progress_and_the_decode_rate(monkeypatch, lm, no_energy):
    _, err = _chat(monkeypatch, lm, "Hi there\nAnd then?\n\n", Terminal())
    cached = re.search(r"prompt \d+ tok \((\d+) cached\)", err)
    assert cached
    assert re.search(r"\r\x1b\[K\[prompt 0/\d+ tok\]", err)  # turn 1: nothing cached
    assert re.search(rf"\r\x1b\[K\[prompt {cached[1]}/\d+ tok \({cached[1]} cached\)\]", err)  # turn 2
    assert re.search(r"\x1b7  \[\d+\.\d tok/s\]\x1b8", err)  # the rate, drawn after the reply's last character


def test_a_reply_taken_while_other_processes_held_the_cpu_says_so(monkeypatch, lm, no_energy):
    """Issue 31 item 5: a reply timed on a disturbed host says so on its stats line."""
    import os

    monkeypatch.setattr(_Load, "cores_busy", 1.3)
    _, err = _chat(monkeypatch, lm, "Hi there\n\n", io.StringIO())
    (stats,) = [ln for ln in err.splitlines() if ln.startswith("[")]
    assert stats.endswith(f" · disturbed: other processes kept 1.3 of {os.cpu_count()} cores busy")


def test_generate_names_real_foreign_load_on_its_stats_line(tmp_path):
    """A real process spinning on a core while `opscope generate` runs: the stats line says the
    timings were disturbed, and --json carries the figure."""
    import json
    import subprocess

    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        r = subprocess.run(
            [sys.executable, "-m", "opscope", "generate", "Hi", "-n", "8", "--temperature", "0"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        j = subprocess.run(
            [sys.executable, "-m", "opscope", "generate", "Hi", "-n", "4", "--json"],
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        spin.kill()
        spin.wait()
    assert r.returncode == 0, r.stderr
    (stats,) = [ln for ln in r.stderr.splitlines() if ln.startswith("[")]
    assert re.search(r" · disturbed: other processes kept \d+\.\d of \d+ cores busy$", stats), stats
    assert j.returncode == 0, j.stderr
    assert json.loads(j.stdout)["other_cores"] >= 0.25
