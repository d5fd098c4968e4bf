"""Which plugins the user disabled, persisted in ``plugins.json`` under the user config dir.

The file holds ``{"disabled": ["name", ...]}``. Plugins are enabled unless listed, so a newly
installed plugin works at once. A damaged file is logged and treated as empty rather than
failing the app: losing a preference is better than refusing to start.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path

from opscope.engine.core.errors import ConfigError

log = logging.getLogger(__name__)

SETTINGS_FILE = "plugins.json"


def settings_path() -> Path:
    import platformdirs  # imported here: only commands that touch settings pay for it

    return Path(platformdirs.user_config_dir("opscope")) / SETTINGS_FILE


def disabled_plugins(path: Path | None = None) -> frozenset[str]:
    """Names of the plugins the user disabled (empty when the file does not exist)."""
    path = path or settings_path()
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return frozenset()
    except (OSError, ValueError) as e:
        log.warning("ignoring unreadable plugin settings %s: %s", path, e)
        return frozenset()
    names = data.get("disabled", []) if isinstance(data, dict) else []
    return frozenset(n for n in names if isinstance(n, str))


def set_enabled(name: str, enabled: bool, path: Path | None = None) -> None:
    """Enable or disable plugin ``name`` and persist the choice (atomically: write, then rename)."""
    path = path or settings_path()
    disabled = set(disabled_plugins(path))
    disabled.discard(name) if enabled else disabled.add(name)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".plugins-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"disabled": sorted(disabled)}, f, indent=2)
        os.replace(tmp, path)
    except OSError as e:
        raise ConfigError(f"cannot save plugin settings to {path}: {e}") from e
