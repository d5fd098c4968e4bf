"""Classification of ops by device, relative to a target: the pure rules on device strings, then
real op streams with the meta device standing in for an accelerator (FakeTensorMode)."""

from __future__ import annotations

import pytest
import torch
from opscope.engine.core.errors import ConfigError
from opscope.engine.trace import classify as cls
from opscope.engine.trace.capture import Tracer
from opscope.engine.trace.events import D2D, D2H, FALLBACK, H2D, HOST, MIXED, ON_TARGET, SYNC, TRANSFER, TraceOptions
from opscope.engine.trace.simulate import simulated_device
from torch import nn

META = cls.DeviceMatcher("meta")
CPU = cls.DeviceMatcher("cpu")


# -- the rules on device strings ------------------------------------------------------------
def test_device_matcher_index_rules():
    any_cuda, cuda1 = cls.DeviceMatcher("cuda"), cls.DeviceMatcher("CUDA:1")
    assert any_cuda("cuda:0") and any_cuda("cuda:3") and not any_cuda("cpu")
    assert cuda1("cuda:1") and not cuda1("cuda:0")
    for bad in ("", "cuda:x", "cuda:0:1"):
        with pytest.raises(ConfigError):
            cls.DeviceMatcher(bad)


def test_directions():
    assert cls.direction("cpu", "cuda:0") == H2D
    assert cls.direction("cuda:0", "cpu") == D2H
    assert cls.direction("cuda:0", "cuda:1") == D2D
    assert cls.direction("meta", "meta") == ""


@pytest.mark.parametrize(
    "role, ins, scalar, outs, copy_ends, expected",
    [
        ("compute", ("meta", "meta"), (False, False), ("meta",), None, (ON_TARGET, "")),
        ("compute", ("cpu", "cpu"), (False, False), ("cpu",), None, (FALLBACK, "")),
        ("compute", (), (), ("cpu",), None, (FALLBACK, "")),  # a factory call without device=
        ("view", ("cpu",), (False,), ("cpu",), None, (HOST, "")),
        ("compute", ("meta", "cpu"), (False, True), ("meta",), None, (ON_TARGET, "")),  # 0-dim host scalar
        ("compute", ("meta", "cpu"), (False, False), ("meta",), None, (MIXED, H2D)),
        ("copy", ("cpu",), (False,), ("meta",), ("cpu", "meta"), (TRANSFER, H2D)),
        ("copy", ("meta",), (False,), ("cpu",), ("meta", "cpu"), (TRANSFER, D2H)),
        ("copy", ("cuda:0",), (False,), ("cuda:1",), ("cuda:0", "cuda:1"), (TRANSFER, D2D)),
        ("copy", ("meta",), (False,), ("meta",), ("meta", "meta"), (ON_TARGET, "")),  # a dtype cast
        ("scalar", ("meta",), (False,), (), None, (SYNC, D2H)),
        ("scalar", ("cpu",), (True,), (), None, (HOST, "")),  # a host value read: nothing waits
        ("sync", ("meta",), (False,), ("meta",), None, (SYNC, "")),
    ],
)
def test_classify_rules_for_an_accelerator_target(role, ins, scalar, outs, copy_ends, expected):
    assert cls.classify(role, ins, scalar, outs, META, copy_ends) == expected


def test_host_reads_are_syncs_when_the_host_is_the_target():
    # the only trace a per-element loop leaves on a CPU target: storms are counted from these
    assert cls.classify("scalar", ("cpu",), (True,), (), CPU) == (SYNC, "")
    assert cls.classify("compute", ("cpu",), (False,), ("cpu",), CPU) == (ON_TARGET, "")


def test_boolean_index_is_data_dependent():
    assert cls.classify("index", ("meta", "meta"), (False, False), ("meta",), META, bool_index=True) == (SYNC, "")
    assert cls.classify("index", ("meta", "meta"), (False, False), ("meta",), META) == (ON_TARGET, "")


def test_op_roles():
    assert cls.op_role("aten._to_copy", False) == cls.ROLE_COPY
    assert cls.op_role("aten.to", False) == cls.ROLE_COPY  # seen undecomposed under inference_mode
    assert cls.op_role("aten.item", False) == cls.ROLE_SCALAR
    assert cls.op_role("aten.nonzero", False) == cls.ROLE_SYNC
    assert cls.op_role("aten.view", True) == cls.ROLE_VIEW
    assert cls.op_role("aten.mm", False) == cls.ROLE_COMPUTE
    assert cls.op_role("prim.device", False) is None


# -- real op streams on the meta stand-in ----------------------------------------------------
def _trace_meta(fn, **opts):
    with simulated_device():
        tracer = Tracer(TraceOptions(target="meta", source="all", **opts))
        with tracer:
            fn()
    return tracer.result()


def _kinds(result):
    return [(e.op, e.kind, e.direction) for e in result.events]


def test_stand_in_stream_transfers_sync_mixed_and_fallback():
    def region():
        x = torch.randn(4, 3).to("meta")  # host creation (fallback) + H2D
        x[torch.tensor([0, 2])]  # host indices into a device tensor: mixed (implicit H2D)
        x.sum().item()  # D2H read that waits
        torch.nonzero(x)  # data-dependent shape
        x[x > 0]  # boolean mask: data-dependent too
        x.cpu()  # D2H

    kinds = _kinds(_trace_meta(region))
    assert ("aten.randn.default", FALLBACK, "") in kinds
    assert ("aten._to_copy.default", TRANSFER, H2D) in kinds
    assert ("aten.index.Tensor", MIXED, H2D) in kinds
    assert ("aten._local_scalar_dense.default", SYNC, D2H) in kinds
    assert ("aten.nonzero.default", SYNC, "") in kinds
    assert ("aten.index.Tensor", SYNC, "") in kinds
    assert ("aten._to_copy.default", TRANSFER, D2H) in kinds


def test_host_scalar_written_into_device_tensor_is_a_tiny_h2d():
    def region():
        buf = torch.empty(3, device="meta")
        buf[0] = torch.tensor(3.0)  # copy_ from a host 0-dim tensor
        buf[1] = 2.0  # a Python scalar: filled on the device, no copy

    result = _trace_meta(region)
    copies = [e for e in result.events if e.op == "aten.copy_.default"]
    assert [(e.kind, e.direction) for e in copies] == [(TRANSFER, H2D), (ON_TARGET, "")]
    assert copies[0].bytes_written == 4
    assert copies[0].pinned is False  # torch.tensor(...) is pageable host memory


class _LeakyBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x):
        h = x.cpu()  # round trip to the host
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.proj(h.to(x.device))


def test_leaky_module_is_named_by_path_and_line():
    model = nn.Sequential(nn.Linear(8, 8), _LeakyBlock()).to("meta")
    with simulated_device():
        tracer = Tracer(TraceOptions(target="meta"), model=model)
        with tracer:
            model(torch.randn(2, 8).to("meta"))
    fallbacks = [e for e in tracer.events if e.kind == FALLBACK and e.module == "1"]
    assert {e.op.split(".")[1] for e in fallbacks} >= {"pow", "mean", "rsqrt", "mul"}
    assert all(e.source.endswith(f"test_trace_classify.py:{_line_of('h = h * torch.rsqrt')}") for e in fallbacks)
    d2h = [e for e in tracer.events if e.kind == TRANSFER and e.direction == D2H]
    assert [e.module for e in d2h] == ["1"]
    on_target = [e for e in tracer.events if e.kind == ON_TARGET]
    assert {e.module for e in on_target} >= {"0", "1.proj"}
    assert all(e.source is None for e in on_target)  # "findings" mode: lines only off the target


def _line_of(text: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if text in line and "_line_of" not in line)
