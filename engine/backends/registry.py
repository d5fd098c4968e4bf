"""Backend plugins: discovered from entry-point metadata, imported on first use, never fatal.

Discovery reads only ``importlib.metadata`` (the ``entry_points.txt`` of installed distributions),
so listing what is installed costs no plugin import and a broken plugin cannot break it. A plugin
is imported the first time it is asked for; whatever goes wrong then (ImportError, an exception at
import time, a missing member, an incompatible ``api_version``) is kept as the plugin's status and
error, logged once, and raised as ``BackendError`` naming the plugin only to the caller that asked
for that very plugin. Every other backend keeps working.
"""

from __future__ import annotations

import importlib.metadata
import logging
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path

from opscope.engine.backends.guard import GuardedBackend
from opscope.engine.backends.protocol import API_VERSION, DeviceInfo, capabilities, missing_members
from opscope.engine.backends.settings import disabled_plugins
from opscope.engine.core.errors import BackendError, EngineError

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "opscope.backends"

# Status values, in the order a plugin moves through them.
DISABLED, NOT_LOADED, OK, UNAVAILABLE, FAILED, INCOMPATIBLE = (
    "disabled",
    "not loaded",
    "ok",
    "unavailable",
    "failed",
    "incompatible",
)


@dataclass(frozen=True)
class PluginInfo:
    """What is known about one plugin: from metadata alone, or after importing it."""

    name: str
    target: str  # the entry point's "module:attr"
    dist_name: str | None
    dist_version: str | None
    enabled: bool = True
    status: str = NOT_LOADED
    error: str = ""
    api_version: int | None = None
    reason: str = ""  # why the backend is unavailable here
    devices: tuple[DeviceInfo, ...] = ()
    capabilities: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "target": self.target,
            "distribution": self.dist_name,
            "version": self.dist_version,
            "enabled": self.enabled,
            "status": self.status,
            "error": self.error,
            "api_version": self.api_version,
            "reason": self.reason,
            "devices": [d.as_dict() for d in self.devices],
            "capabilities": list(self.capabilities),
        }


@dataclass
class _Entry:
    info: PluginInfo
    entry_point: importlib.metadata.EntryPoint | None
    backend: GuardedBackend | None = None
    cause: BaseException | None = field(default=None, repr=False)


class Registry:
    """The backend plugins of one entry-point group, each imported at most once."""

    def __init__(self, group: str = ENTRY_POINT_GROUP, settings_file: Path | None = None):
        self.group = group
        self.settings_file = settings_file
        self._lock = threading.RLock()
        self._entries: dict[str, _Entry] | None = None

    def refresh(self) -> None:
        """Forget everything: the next call rediscovers (after a pip install, or a settings change)."""
        with self._lock:
            self._entries = None

    def discover(self) -> list[PluginInfo]:
        """Every declared plugin, from metadata only: no plugin code is imported."""
        return [e.info for e in self._all().values()]

    def names(self) -> list[str]:
        return list(self._all())

    def info(self, name: str, load: bool = True) -> PluginInfo:
        """One plugin's info; with ``load``, import it (once) to learn its devices and status."""
        entry = self._entry(name)
        if load and entry.info.status == NOT_LOADED:
            self._load(entry)
        return entry.info

    def infos(self, load: bool = True) -> list[PluginInfo]:
        return [self.info(name, load) for name in self.names()]

    def get(self, name: str, require_available: bool = True) -> GuardedBackend:
        """The backend called ``name``, imported on first use; BackendError if it cannot be used."""
        entry = self._entry(name)
        info = self.info(name, load=True)
        if info.status == DISABLED:
            raise BackendError(f"backend plugin {name!r} is disabled: run `opscope plugins enable {name}`")
        if info.status in (FAILED, INCOMPATIBLE):
            raise BackendError(
                f"backend plugin {name!r} ({_dist_label(info)}) {info.status}: {info.error}"
            ) from entry.cause
        if require_available and info.status == UNAVAILABLE:
            raise BackendError(f"backend {name!r} is not available here: {info.reason}")
        assert entry.backend is not None  # status OK/UNAVAILABLE implies a loaded backend
        return entry.backend

    def _entry(self, name: str) -> _Entry:
        entries = self._all()
        if name not in entries:
            known = ", ".join(entries) or "none"
            raise BackendError(f"no backend plugin named {name!r} (installed: {known})")
        return entries[name]

    def _all(self) -> dict[str, _Entry]:
        with self._lock:
            if self._entries is None:
                self._entries = _discover(self.group, disabled_plugins(self.settings_file))
            return self._entries

    def _load(self, entry: _Entry) -> None:
        with self._lock:
            if entry.info.status != NOT_LOADED:
                return  # another thread loaded it while we waited
            try:
                entry.backend = _import_backend(entry.info, entry.entry_point)
            except BackendError as e:
                status = INCOMPATIBLE if isinstance(e, IncompatiblePlugin) else FAILED
                entry.cause = e.__cause__ or e
                entry.info = replace(entry.info, status=status, error=str(e))
                log.warning("backend plugin %r %s: %s", entry.info.name, status, e)
                return
            entry.info = _describe(entry.info, entry.backend)


class IncompatiblePlugin(BackendError):
    """A plugin written against another version of the Backend API."""


def _discover(group: str, disabled: frozenset[str]) -> dict[str, _Entry]:
    entries: dict[str, _Entry] = {}
    for ep in sorted(importlib.metadata.entry_points(group=group), key=lambda e: e.name):
        dist = getattr(ep, "dist", None)
        info = PluginInfo(
            name=ep.name,
            target=ep.value,
            dist_name=dist.metadata["Name"] if dist else None,
            dist_version=dist.version if dist else None,
            enabled=ep.name not in disabled,
        )
        if not info.enabled:
            info = replace(info, status=DISABLED)
        if ep.name in entries:
            first = entries[ep.name].info
            log.warning(
                "backend plugin %r from %s ignored: %s already provides it",
                ep.name,
                _dist_label(info),
                _dist_label(first),
            )
            continue
        entries[ep.name] = _Entry(info, ep)
    return entries


def _import_backend(info: PluginInfo, ep: importlib.metadata.EntryPoint | None) -> GuardedBackend:
    label = f"backend plugin {info.name!r} ({_dist_label(info)}, {info.target})"
    try:
        if ep is None:  # discovered without one (cannot happen for an entry the registry lists)
            raise ImportError("no entry point to import")
        obj = ep.load()
        backend = obj() if isinstance(obj, type) else obj
    except (Exception, SystemExit) as e:  # a plugin may raise anything at import; never fatal
        raise BackendError(f"{label} failed to import: {type(e).__name__}: {e}") from e
    missing = missing_members(backend)
    if missing:
        raise IncompatiblePlugin(f"{label} lacks required members {', '.join(missing)}")
    version = backend.api_version
    if version != API_VERSION:
        newer = isinstance(version, int) and version > API_VERSION
        fix = "upgrade OpScope" if newer else "upgrade the plugin or ask its author to port it"
        raise IncompatiblePlugin(f"{label} targets backend API v{version}, this OpScope provides v{API_VERSION}: {fix}")
    if backend.name != info.name:
        log.warning("%s calls itself %r; using the entry-point name", label, backend.name)
    return GuardedBackend(info.name, backend)


def _describe(info: PluginInfo, backend: GuardedBackend) -> PluginInfo:
    try:
        available, reason = backend.is_available()
        devices = tuple(backend.devices()) if available else ()
    except EngineError as e:  # a plugin's own typed error while probing: still only a status
        return replace(info, status=FAILED, error=str(e), api_version=backend.api_version)
    return replace(
        info,
        status=OK if available else UNAVAILABLE,
        reason="" if available else reason,
        api_version=backend.api_version,
        devices=devices,
        capabilities=tuple(sorted(capabilities(backend.plugin))),
    )


def _dist_label(info: PluginInfo) -> str:
    if info.dist_name is None:
        return "unknown distribution"
    return f"{info.dist_name} {info.dist_version}"


# The process-wide registry the CLI and the app use.
_default = Registry()


def default_registry() -> Registry:
    return _default


def list_backends(load: bool = True) -> list[PluginInfo]:
    """Every backend plugin with its status; with ``load``, enabled plugins are imported to learn
    their availability and devices (failures become a status, never an exception)."""
    return _default.infos(load=load)


def get_backend(name: str, require_available: bool = True) -> GuardedBackend:
    """The backend plugin ``name``, ready to ``load(...)`` a model; BackendError naming the plugin
    and saying what to do when it is unknown, disabled, broken, incompatible or unavailable."""
    return _default.get(name, require_available=require_available)


def refresh() -> None:
    """Rediscover plugins (after installing one, or enabling/disabling one)."""
    _default.refresh()


__all__ = [
    "ENTRY_POINT_GROUP",
    "PluginInfo",
    "Registry",
    "IncompatiblePlugin",
    "default_registry",
    "get_backend",
    "list_backends",
    "refresh",
]
