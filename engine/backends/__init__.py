"""Backends as plugins: the Backend API (``protocol``) and the registry that finds plugins.

Public surface::

    from opscope.engine.backends import get_backend, list_backends
    backend = get_backend("mlx")                 # imported on first use; BackendError if unusable
    model = backend.load(None, device="cpu")     # None: the embedded default model
    for event in model.generate("Hello", config): ...

Plugins declare themselves in the ``opscope.backends`` entry-point group; see docs/plugins.md.
"""

from opscope.engine.backends.base import BackendBase
from opscope.engine.backends.guard import GuardedBackend
from opscope.engine.backends.loop import Stepper, check_prompt, stream_generation
from opscope.engine.backends.protocol import API_VERSION, Backend, DeviceInfo, LoadedModelLike, OpEvent, capabilities
from opscope.engine.backends.registry import (
    ENTRY_POINT_GROUP,
    IncompatiblePlugin,
    PluginInfo,
    Registry,
    default_registry,
    get_backend,
    list_backends,
    refresh,
)

__all__ = [
    "API_VERSION",
    "Backend",
    "BackendBase",
    "DeviceInfo",
    "ENTRY_POINT_GROUP",
    "GuardedBackend",
    "IncompatiblePlugin",
    "LoadedModelLike",
    "OpEvent",
    "PluginInfo",
    "Registry",
    "Stepper",
    "capabilities",
    "check_prompt",
    "default_registry",
    "get_backend",
    "list_backends",
    "refresh",
    "stream_generation",
]
