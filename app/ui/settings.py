"""Persistent GUI settings (QSettings, INI format everywhere so tests can point it at a temp dir)."""

from __future__ import annotations

from PySide6.QtCore import QSettings

ORGANIZATION = "opscope"
APPLICATION = "opscope-gui"
MAX_RECENT_MODELS = 8


def settings() -> QSettings:
    return QSettings(QSettings.IniFormat, QSettings.UserScope, ORGANIZATION, APPLICATION)


def use_directory(path: str) -> None:
    """Keep settings under ``path`` (tests, portable installs)."""
    QSettings.setPath(QSettings.IniFormat, QSettings.UserScope, path)


def recent_models() -> list[str]:
    value = settings().value("models/recent", [])
    if isinstance(value, str):  # QSettings returns a lone string for a one-item list
        value = [value]
    return [str(v) for v in value or []]


def add_recent_model(path: str) -> list[str]:
    recent = [path] + [p for p in recent_models() if p != path]
    recent = recent[:MAX_RECENT_MODELS]
    settings().setValue("models/recent", recent)
    return recent


def value(key: str, default=None, type_=None):
    s = settings()
    return s.value(key, default, type=type_) if type_ is not None else s.value(key, default)


def set_value(key: str, val) -> None:
    settings().setValue(key, val)
