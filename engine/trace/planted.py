"""Planted bugs: two modules that compute the right numbers in the wrong way.

They live in this small file on purpose: the placement report must name this file and the line of
each bug (the lines marked "BUG"). engine.trace.variants swaps them into a loaded model.
"""

from __future__ import annotations

import torch
from torch import nn


def _eps(norm: nn.Module) -> float:
    for name in ("eps", "norm_eps", "variance_epsilon"):
        value = getattr(norm, name, None)
        if isinstance(value, float):
            return value
    return 1e-5


class LeakyRMSNorm(nn.Module):
    """RMSNorm whose weight was left on the host: every call copies the activation to the CPU,
    normalizes there, and copies the result back (the classic silent fallback)."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.eps = _eps(norm)
        weight = norm.weight.detach()
        # A plain attribute, not a buffer: model.to(device) leaves it behind, as in the real bug.
        self.host_weight = torch.ones(weight.shape) if weight.is_meta else weight.to("cpu", torch.float32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.to("cpu", torch.float32)  # BUG: leaves the device  [B, T, D]
        y = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps) * self.host_weight  # BUG: computes on the host
        return y.to(x.device, x.dtype)  # BUG: and copies back


class PerElementCopy(nn.Module):
    """Wraps a module and rebuilds the last position of its output one element at a time through
    Python scalars: one device→host read and one host→device write per element."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.inner(x)  # [B, T, D]
        last = y[:, -1, :]  # [B, D]
        out = torch.empty_like(last)
        for b in range(last.shape[0]):
            for i in range(last.shape[1]):
                out[b, i] = last[b, i].item()  # BUG: per-element copy through a Python float
        return torch.cat([y[:, :-1, :], out.unsqueeze(1)], dim=1)
