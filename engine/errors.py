"""One error hierarchy for everything the engine raises at a user.

Each error carries a message that says what failed, on which object, and what to do. The CLI
prints ``str(err)`` on one line and exits with ``exit_code``; the GUI shows the same text.
"""
from __future__ import annotations


class EngineError(Exception):
    """Root of every error the engine raises on purpose."""

    exit_code = 2


class ModelFormatError(EngineError):
    """A model file or directory is missing, corrupt, truncated or hostile."""


class UnsupportedModelError(EngineError):
    """A well-formed model that this engine cannot run (architecture, quantization type)."""


class ConfigError(EngineError):
    """A bad setting: device, dtype, sampling flag, suite parameter."""


class DeviceError(EngineError):
    """The requested device does not exist or is not usable."""


class BackendError(EngineError):
    """A backend plugin is missing, failed to load, or is incompatible."""


class StoreError(EngineError):
    """The run store cannot be opened, migrated or written."""


class RunNotFoundError(StoreError):
    """No saved run matches the id or name given."""


class Cancelled(EngineError):
    """A long operation was cancelled by the user."""

    exit_code = 130
