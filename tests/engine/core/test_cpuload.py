"""engine.cpuload: other processes' CPU use from /proc, and decode threads that yield to it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from opscope.engine.core.cpuload import LoadAwareThreads, OtherLoad


def fake_proc(root: Path, busy: tuple[int, int, int, int, int], own: tuple[int, int]) -> None:
    user, nice, system, irq, softirq = busy
    (root / "self").mkdir(parents=True, exist_ok=True)
    (root / "stat").write_text(f"cpu  {user} {nice} {system} 9999 7 {irq} {softirq} 3 0 0\ncpu0 1 2 3\n")
    # a process name with spaces and a parenthesis, as /proc allows: fields are counted after the last ")"
    (root / "self" / "stat").write_text(
        f"42 (py (x) y) R 1 42 42 0 -1 4194560 1 0 0 0 {own[0]} {own[1]} 0 0 20 0 3 0 100 0 0\n"
    )


def test_other_load_counts_busy_jiffies_minus_our_own(tmp_path):
    clock = iter([0.0, 2.0]).__next__
    fake_proc(tmp_path, (100, 0, 50, 0, 0), (10, 5))
    load = OtherLoad(tmp_path, clock)
    # 2 s later: 400 busy jiffies more, 100 of them ours -> 300 / hz / 2 s of others
    fake_proc(tmp_path, (400, 20, 100, 20, 10), (80, 35))
    assert load.cores() == pytest.approx(300 / load.hz / 2.0)


def test_other_load_without_proc_is_none(tmp_path):
    assert OtherLoad(tmp_path / "missing").cores() is None


class FakeLoad:
    def __init__(self, n_cpus, values):
        self.n_cpus, self.values = n_cpus, list(values)

    def cores(self):
        return self.values.pop(0)


def test_threads_follow_free_cores_within_bounds():
    t = [0.0]
    calls = []
    ctl = LoadAwareThreads(2, calls.append, FakeLoad(2, [1.0, 0.1, 0.6, None, 0.4]), period_s=0.25, clock=lambda: t[0])
    ctl.step()  # before the first period: nothing read, nothing set
    assert calls == [] and ctl.threads == 2
    for now, want in ((0.3, 1), (0.6, 2), (0.9, 1), (1.2, 1), (1.5, 2)):  # None: no reading, no change
        t[0] = now
        ctl.step()
        assert ctl.threads == want, now
    assert calls == [1, 2, 1, 2]
    many = LoadAwareThreads(4, calls.append, FakeLoad(16, [3.0]), period_s=0.0, clock=lambda: 1.0)
    many.step()
    assert many.threads == 4  # never more than the threads the model was loaded with


def test_a_real_busy_process_is_seen(tmp_path):
    """A real busy loop in another process shows up as about one core (Linux /proc)."""
    if not Path("/proc/stat").exists():
        pytest.skip("no /proc on this system")
    load = OtherLoad()
    hog = subprocess.Popen([sys.executable, "-c", "import time\nt=time.time()\nwhile time.time()-t<3: pass"])
    try:
        time.sleep(0.3)
        load.cores()  # start the window once the hog runs
        time.sleep(1.0)
        busy = load.cores()
    finally:
        hog.kill()
    assert busy is not None and busy >= 0.5, busy


def test_fast_path_decodes_with_load_aware_threads(lm):
    import torch
    from opscope.engine.generation.generate import decode_threads

    # lm: the default model through the fast path (the session's load)
    assert lm.model.decode_threads == "auto"
    have = torch.get_num_threads()
    with decode_threads(lm.model) as ctl:
        assert isinstance(ctl, LoadAwareThreads) and ctl.max_threads == have
        torch.set_num_threads(1)  # what the controller does under load ...
    assert torch.get_num_threads() == have  # ... is undone when decode ends
