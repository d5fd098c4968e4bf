"""A base class for backend plugins: the steps every ``load()`` takes before the plugin's own part.

A plugin subclasses ``BackendBase``, names the ``load_options`` it accepts and implements
``load_model``; ``load`` rejects unknown options and an unavailable backend with one clear error
first, so each plugin writes only what is its own (building the model).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from opscope.engine.backends.protocol import API_VERSION
from opscope.engine.core.errors import BackendError, ConfigError


class BackendBase:
    """The shared half of a Backend (engine.backends.protocol.Backend): subclasses set ``name`` and
    ``load_options`` and implement ``is_available``, ``devices`` and ``load_model``."""

    name: str = ""
    api_version: int = API_VERSION
    load_options: frozenset[str] = frozenset()  # keyword options load() accepts

    def is_available(self) -> tuple[bool, str]:
        raise NotImplementedError

    def load(
        self, source: str | Path | None = None, device: str = "cpu", dtype: str = "float32", **options: Any
    ) -> Any:
        """Check ``options`` and availability, then ``load_model`` (None: the default model)."""
        unknown = set(options) - self.load_options
        if unknown:
            raise ConfigError(f"{self.name} backend: unknown option(s) {', '.join(sorted(unknown))}")
        ok, reason = self.is_available()
        if not ok:
            raise BackendError(f"backend {self.name!r} is not available: {reason}")
        return self.load_model(source, device=device, dtype=dtype, **options)

    def load_model(self, source: str | Path | None, device: str, dtype: str, **options: Any) -> Any:
        """The plugin's own part: build the loaded model (options already checked)."""
        raise NotImplementedError
