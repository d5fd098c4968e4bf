"""Issue 31 item 5: prefill on the CPU takes the cores other processes leave free, as decode does."""

from __future__ import annotations

import types

import torch
from opscope.engine.generation.generate import prefill_threads


class FakeLoad:
    def __init__(self, others, n_cpus=2):
        self.others, self.n_cpus = others, n_cpus

    def cores(self):
        return self.others


def _model(device="cpu"):
    return types.SimpleNamespace(embed=types.SimpleNamespace(weight=torch.empty(1, device=device)))


def _threads_inside(load) -> int:
    with prefill_threads(_model(), load):
        return torch.get_num_threads()


def test_prefill_gives_a_busy_core_back_and_restores_the_count():
    have = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert _threads_inside(FakeLoad(1.0)) == 1  # another process held one of the 2 cores
        assert torch.get_num_threads() == 2
        assert _threads_inside(FakeLoad(0.1)) == 2  # quiet: every thread
        assert _threads_inside(FakeLoad(None)) == 2  # unknown (no /proc, first read): unchanged
        assert _threads_inside(FakeLoad(5.0)) == 1  # never below one
    finally:
        torch.set_num_threads(have)
