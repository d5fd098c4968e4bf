"""The capture itself on small real modules (CPU): module paths, source lines, the event cap,
steps, markers, the garbage-collector pause, and CUDA device timing through a stand-in event."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest
import torch
from opscope.engine.core import markers
from opscope.engine.core.errors import ConfigError
from opscope.engine.trace.capture import Tracer
from opscope.engine.trace.devtime import DeviceTimer
from opscope.engine.trace.events import ON_TARGET, SYNC, TraceOptions
from opscope.engine.trace.modstack import ROOT
from torch import nn


class _Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.proj(x))


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), _Inner())


def _trace(model, fn, **opts):
    tracer = Tracer(TraceOptions(**opts), model=model)
    with tracer:
        fn()
    return tracer


@pytest.mark.parametrize("hooks", ["model", "global"])
def test_module_paths_with_either_hook_mode(hooks):
    model = _model()
    x = torch.randn(2, 4)
    tracer = _trace(model, lambda: model(x), hooks=hooks)
    by_module = {e.module for e in tracer.events}
    assert {"0", "1.proj", "1"} <= by_module  # relu runs in the inner module, outside its proj
    relu = next(e for e in tracer.events if "relu" in e.op)
    assert relu.module == "1"
    assert not tracer.modules.stack and not tracer.modules._handles  # hooks removed


def test_root_and_outside_are_told_apart():
    model = _model()
    x = torch.randn(2, 4)
    tracer = _trace(model, lambda: model(x).sum())
    assert tracer.events[-1].op.startswith("aten.sum") and tracer.events[-1].module == ""
    root_only = Tracer(TraceOptions(), model=nn.Linear(4, 4))
    with root_only:
        root_only.modules.model(x)
    assert {e.module for e in root_only.events} == {ROOT}


def test_source_modes():
    x = torch.randn(3)
    for mode, expect_on_target in (("off", False), ("findings", False), ("all", True)):
        tracer = _trace(None, lambda: (x * 2).sum().item(), source=mode)
        on_target = [e for e in tracer.events if e.kind == ON_TARGET]
        syncs = [e for e in tracer.events if e.kind == SYNC]
        assert all((e.source is not None) == expect_on_target for e in on_target)
        assert all((e.source is not None) == (mode != "off") for e in syncs)
        if mode != "off":
            assert syncs[0].source.startswith("tests/engine/trace/test_trace_capture.py:")
    with pytest.raises(ConfigError):
        Tracer(TraceOptions(source="sometimes"))


def test_event_cap_keeps_counting():
    x = torch.randn(3)

    def region():
        for _ in range(10):
            x.sum().item()

    tracer = _trace(None, region, max_events=5)
    assert len(tracer.events) == 5 and tracer.dropped == 15
    assert tracer.stats.ops == 20
    assert tracer.stats.kind_count[SYNC] == 10 and tracer.stats.syncs_total() == 10


def test_steps_follow_tokens_and_markers_are_kept():
    x = torch.randn(3)
    tracer = Tracer(TraceOptions())
    with tracer:
        markers.emit(markers.DECODE, "start")
        x.add(1.0)
        tracer.mark_token()
        x.add(1.0)
        tracer.mark_token()
        markers.emit(markers.DECODE, "end")
    result = tracer.result()
    assert [e.step for e in result.events] == [0, 1]
    assert result.tokens == 2
    assert [(m.phase, m.edge) for m in result.markers] == [("decode", "start"), ("decode", "end")]
    markers.emit(markers.DECODE, "start")  # unsubscribed on exit
    assert len(result.markers) == 2


def test_gc_paused_while_tracing_and_restored_even_on_error():
    assert gc.isenabled()
    model = _model()
    with pytest.raises(RuntimeError):
        with Tracer(TraceOptions(), model=model) as tracer:
            assert not gc.isenabled()
            model(torch.randn(2, 5))  # wrong width: raises inside a module
    assert gc.isenabled()
    assert not tracer.modules.stack and not tracer.modules._handles


def test_ignored_queries_are_not_recorded():
    x = torch.randn(3)
    tracer = _trace(None, lambda: (x.size(), x.dim(), x.add(1)))
    assert [e.op for e in tracer.events] == ["aten.add.Tensor"]


class _StandInCudaEvent:
    """torch.cuda.Event's API (record, elapsed_time in ms) on a counter clock: no GPU here."""

    clock = [0.0]

    def __init__(self):
        self.t = None

    def record(self, stream=None):
        self.clock[0] += 0.5
        self.t = self.clock[0]

    def elapsed_time(self, end: _StandInCudaEvent) -> float:
        if self.t is None or end.t is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return end.t - self.t


def test_device_time_resolved_with_one_synchronize():
    syncs = []
    timer = DeviceTimer(_StandInCudaEvent, lambda: syncs.append(1), max_pairs=100)

    class _Op:  # what the timer sees of an op event
        def __init__(self, device):
            self.device, self.device_dur_ns = device, None

    ops = [_Op("cuda:0"), _Op("cpu"), _Op("cuda:0")]
    for op in ops:
        timer.stop(op, timer.start())
    assert syncs == []  # nothing waits while recording
    assert timer.resolve() == 2 and syncs == [1]
    assert ops[0].device_dur_ns == pytest.approx(0.5e6) and ops[1].device_dur_ns is None


def test_device_times_reach_the_stats_by_kind():
    timer = DeviceTimer(_StandInCudaEvent, lambda: None, max_pairs=100)
    tracer = Tracer(TraceOptions(target="cpu"), device_timer=timer)
    with tracer:  # CPU ops: the stand-in timer skips host ops, so nothing is timed
        torch.randn(3).add(1)
    assert tracer.result().device_timed == 0 and not tracer.stats.kind_device_ns


def test_device_timer_respects_its_cap():
    timer = DeviceTimer(_StandInCudaEvent, lambda: None, max_pairs=1)
    assert timer.start() is not None
    timer.stop(type("Op", (), {"device": "cuda:0", "device_dur_ns": None})(), timer.start())
    assert timer.start() is None


def test_registering_the_cli_command_does_not_import_torch():
    code = (
        "import argparse, sys, opscope.engine.cli.commands.trace as c; "
        "c.register(argparse.ArgumentParser().add_subparsers()); "
        "import opscope.engine.trace; from opscope import engine; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
