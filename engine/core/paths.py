"""Where the benchmark area keeps its caches (model hashes, measured peaks)."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "OPSCOPE_CACHE_DIR"


def cache_dir() -> Path:
    """``$OPSCOPE_CACHE_DIR`` if set (tests, CI), else the platform's user cache dir."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override)
    import platformdirs

    return Path(platformdirs.user_cache_dir("opscope"))
