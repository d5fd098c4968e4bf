"""An accelerator stand-in for machines without one: the meta device under FakeTensorMode.

Fake tensors carry device, dtype and shape but no data, so a model "on meta" runs its real op
stream (with real cross-device copies, device-mismatch errors and host reads) at no compute cost.
What cannot be faked is a value: ``.item()`` of a fake tensor returns a placeholder (0), so
sampled token ids are placeholders and generation must ignore EOS. Placement is what is real.

    with simulated_device():
        stand_in = to_device_stand_in(model)   # shares no data with ``model``
        ...trace stand_in under a Tracer entered inside this block...
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

STAND_IN = "meta"
_aten = torch.ops.aten


class PlaceholderValues(TorchDispatchMode):
    """Answers the value questions fake tensors cannot: scalars read as 0, data-dependent
    shapes come out empty. Sits between the Tracer (above, still sees every op) and fake mode."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        x = args[0] if args else None
        if isinstance(x, FakeTensor):
            if func is _aten._local_scalar_dense.default or func is _aten.item.default:
                return False if x.dtype == torch.bool else 0 if not x.is_floating_point() else 0.0
            if func is _aten.nonzero.default:
                return torch.empty((0, x.dim()), dtype=torch.long, device=x.device)
            if func is _aten.masked_select.default:
                return torch.empty((0,), dtype=x.dtype, device=x.device)
            if func is _aten.index.Tensor and _single_mask(args[1]):
                rest = x.shape[args[1][0].dim() :]  # x[mask] selects rows: [N, *rest], N unknown → 0
                return torch.empty((0, *rest), dtype=x.dtype, device=x.device)
        return func(*args, **kwargs)


def _single_mask(indices) -> bool:
    return len(indices) == 1 and isinstance(indices[0], torch.Tensor) and indices[0].dtype in (torch.bool, torch.uint8)


@contextmanager
def simulated_device() -> Iterator[FakeTensorMode]:
    """Fake mode (real tensors allowed in, converted on use) with placeholder values on top."""
    fake = FakeTensorMode(allow_non_fake_inputs=True)
    with fake, PlaceholderValues():
        yield fake


def to_device_stand_in(model: nn.Module, device: str = STAND_IN) -> nn.Module:
    """A copy of ``model`` whose parameters and buffers live on ``device`` (meta: no memory).
    Parameters and buffers are converted without copying their data; the module tree is copied."""
    memo: dict[int, torch.Tensor] = {}
    for t in itertools.chain(model.parameters(), model.buffers()):
        moved = t.detach().to(device)
        memo[id(t)] = nn.Parameter(moved, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else moved
    return copy.deepcopy(model, memo)
