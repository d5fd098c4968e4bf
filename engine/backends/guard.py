"""A backend as the engine hands it out: every call into plugin code is wrapped so that whatever
the plugin raises reaches the caller as an ``EngineError`` naming the plugin.

``EngineError`` subclasses raised on purpose (``ModelFormatError`` for a missing file,
``DeviceError`` for a bad device) pass through unchanged, so users see the plugin's own message;
anything else (a RuntimeError deep in a framework) becomes ``BackendError`` chained to it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from opscope.engine.backends.protocol import OPTIONAL_MEMBERS, DeviceInfo
from opscope.engine.core.errors import BackendError, EngineError


def call_guarded(plugin_name: str, what: str, fn: Callable, *args, **kwargs):
    """``fn(*args, **kwargs)``, with foreign exceptions turned into BackendError naming the plugin."""
    try:
        return fn(*args, **kwargs)
    except EngineError:
        raise
    except Exception as e:
        raise BackendError(f"backend plugin {plugin_name!r} failed in {what}: {type(e).__name__}: {e}") from e


class GuardedBackend:
    """Wraps a plugin's Backend object; ``.plugin`` is the object itself."""

    def __init__(self, name: str, plugin: Any):
        self.name = name
        self.plugin = plugin

    @property
    def api_version(self) -> int:
        return self.plugin.api_version

    def is_available(self) -> tuple[bool, str]:
        available, reason = call_guarded(self.name, "is_available()", self.plugin.is_available)
        return bool(available), str(reason or "")

    def devices(self) -> list[DeviceInfo]:
        devices = call_guarded(self.name, "devices()", self.plugin.devices)
        bad = [d for d in devices if not isinstance(d, DeviceInfo)]
        if bad:
            raise BackendError(
                f"backend plugin {self.name!r}: devices() returned {bad[0]!r}, not engine.backends.DeviceInfo"
            )
        return list(devices)

    def load(self, source=None, device: str = "cpu", dtype: str = "float32", **options):
        """Load a model with this backend (see ``Backend.load``)."""
        return call_guarded(
            self.name,
            f"load(device={device!r}, dtype={dtype!r})",
            self.plugin.load,
            source,
            device=device,
            dtype=dtype,
            **options,
        )

    def __getattr__(self, attr: str):
        # Only the protocol's optional members are forwarded, guarded like the required ones.
        if attr not in OPTIONAL_MEMBERS:
            raise AttributeError(attr)
        fn = getattr(self.plugin, attr)  # AttributeError when the plugin lacks it
        return functools.partial(call_guarded, self.name, f"{attr}()", fn)

    def __repr__(self) -> str:
        return f"GuardedBackend({self.name!r}, {self.plugin!r})"
