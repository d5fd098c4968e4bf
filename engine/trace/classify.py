"""Classify one op by where its tensors live, relative to a target device.

Everything here works on device *strings* ("cpu", "cuda:0", "meta"), so the rules are the same for
every accelerator and are tested with the meta device standing in for one. The host is "cpu".

Roles (what an op does, from its name alone; cached per op overload in engine.trace.capture):
  copy      cross-device capable copies (``_to_copy``, ``copy_``, ``_copy_from``)
  scalar    ``_local_scalar_dense`` / ``item``: ``.item()``, ``int(t)``, ``float(t)``
  sync      data-dependent output shapes: the host must wait for the values (``nonzero`` ...)
  index     indexing that turns data-dependent when given a boolean mask
  view      metadata only (views, ``detach``, ``lift_fresh``): no data moves, no compute
  compute   everything else
"""

from __future__ import annotations

from opscope.engine.core.errors import ConfigError
from opscope.engine.trace.events import D2D, D2H, FALLBACK, H2D, HOST, MIXED, ON_TARGET, SYNC, TRANSFER

HOST_DEVICE = "cpu"

# Under torch.inference_mode the dispatcher hands composite ops (aten.to, aten.item, aten.linear)
# to the trace undecomposed; without it, their pieces (_to_copy, _local_scalar_dense, addmm).
COPY_OPS = frozenset({"aten._to_copy", "aten.to", "aten.copy_", "aten._copy_from", "aten._copy_from_and_resize"})
SCALAR_OPS = frozenset({"aten._local_scalar_dense", "aten.item"})
# Ops whose output shape or value the host needs before it can go on (a device sync on CUDA).
SYNC_OPS = frozenset(
    {
        "aten.nonzero",
        "aten.masked_select",
        "aten._unique",
        "aten._unique2",
        "aten.unique_dim",
        "aten.unique_consecutive",
        "aten.unique_dim_consecutive",
        "aten.is_nonzero",
        "aten.equal",
        "aten.repeat_interleave",
    }
)
INDEX_OPS = frozenset({"aten.index", "aten.index_put", "aten.index_put_", "aten._index_put_impl_"})
# Not views by schema, but metadata-only all the same.
EXTRA_VIEW_OPS = frozenset({"aten._unsafe_view", "aten.lift", "aten.lift_fresh_copy", "aten.detach_"})
# Queries about a tensor, not ops on its data: not recorded at all.
IGNORED_OPS = frozenset(
    {
        "prim.device",
        "aten.sym_size",
        "aten.sym_stride",
        "aten.sym_numel",
        "aten.sym_storage_offset",
        "aten.is_contiguous",
        "aten.is_strides_like_format",
        "aten.is_non_overlapping_and_dense",
        "aten.dim",
        "aten.size",
        "aten.stride",
    }
)

ROLE_COPY, ROLE_SCALAR, ROLE_SYNC, ROLE_INDEX, ROLE_VIEW, ROLE_COMPUTE = (
    "copy",
    "scalar",
    "sync",
    "index",
    "view",
    "compute",
)


def op_role(packet: str, is_view: bool) -> str | None:
    """Role of an op from its packet name ("aten.mm"); None for ops the trace ignores."""
    if packet in IGNORED_OPS:
        return None
    if packet in COPY_OPS:
        return ROLE_COPY
    if packet in SCALAR_OPS:
        return ROLE_SCALAR
    if packet in SYNC_OPS:
        return ROLE_SYNC
    if packet in INDEX_OPS:
        return ROLE_INDEX
    if is_view or packet in EXTRA_VIEW_OPS:
        return ROLE_VIEW
    return ROLE_COMPUTE


class DeviceMatcher:
    """Is a device string the target? "cuda" matches every "cuda:N"; "cuda:1" only itself."""

    def __init__(self, target: str):
        target = target.strip().lower()
        if not target or target.count(":") > 1:
            raise ConfigError(f"bad trace target device {target!r}: expected e.g. cpu, cuda, cuda:0, meta, mps")
        self.target = target
        self.kind, _, index = target.partition(":")
        if index and not index.isdigit():
            raise ConfigError(f"bad trace target device {target!r}: the index after ':' must be a number")
        self._any_index = not index
        self._cache: dict[str, bool] = {}

    def __call__(self, device: str) -> bool:
        hit = self._cache.get(device)
        if hit is None:
            hit = device == self.target or (self._any_index and device.partition(":")[0] == self.kind)
            self._cache[device] = hit
        return hit


def direction(src: str, dst: str) -> str:
    """H2D / D2H / D2D for a copy between two different devices; "" for a same-device copy."""
    if src == dst:
        return ""
    if src == HOST_DEVICE:
        return H2D
    return D2H if dst == HOST_DEVICE else D2D


def classify(
    role: str,
    in_devices: tuple[str, ...],
    in_scalar: tuple[bool, ...],
    out_devices: tuple[str, ...],
    is_target: DeviceMatcher,
    copy_src_dst: tuple[str, str] | None = None,
    bool_index: bool = False,
) -> tuple[str, str]:
    """(kind, direction) of one op. ``in_scalar[i]``: input i is a 0-dim host tensor, which
    accelerators take as a plain scalar argument (not mixed). ``copy_src_dst``: (source,
    destination) of a copy op. ``bool_index``: an index op got a boolean mask."""
    if role == ROLE_SCALAR:  # a host read of a device value waits for the device
        src = in_devices[0] if in_devices else HOST_DEVICE
        if src != HOST_DEVICE:
            return SYNC, D2H
        # Reading host memory waits for nothing, unless the host is the target: then it is the
        # only trace a per-element loop leaves, and storms are counted from it.
        return (SYNC if is_target(HOST_DEVICE) else HOST), ""
    if role == ROLE_COPY and copy_src_dst is not None and copy_src_dst[0] != copy_src_dst[1]:
        return TRANSFER, direction(*copy_src_dst)
    if role == ROLE_SYNC or (role == ROLE_INDEX and bool_index):
        return SYNC, ""
    devices = set(in_devices)
    devices.update(out_devices)
    if len(devices) > 1:  # the common single-device case skips this loop
        devices = {d for d, s in zip(in_devices, in_scalar) if not s}
        devices.update(out_devices)
        if len(devices) > 1:
            return MIXED, (H2D if HOST_DEVICE in devices else D2D)
    device = next(iter(devices)) if devices else (in_devices[0] if in_devices else HOST_DEVICE)
    if is_target(device):
        return ON_TARGET, ""
    if role == ROLE_VIEW or not (in_devices or out_devices):
        return HOST, ""
    return FALLBACK, ""
