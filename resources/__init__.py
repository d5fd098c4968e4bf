"""OpScope's icons, stylesheets and desktop entry, found through importlib.resources so that they
work from a checkout, an installed wheel, a zip or a frozen bundle alike."""

from __future__ import annotations

from importlib.resources import files

ICON_SIZES = (16, 24, 32, 48, 64, 128, 256, 512)
THEMES = ("light", "dark")


def read_bytes(name: str) -> bytes:
    """The bytes of resource ``name`` (e.g. ``"opscope.svg"``, ``"icons/opscope-64.png"``)."""
    return files(__name__).joinpath(name).read_bytes()


def read_text(name: str) -> str:
    return files(__name__).joinpath(name).read_text(encoding="utf-8")


def stylesheet(theme: str) -> str:
    """The Qt stylesheet for ``theme`` ("light" or "dark")."""
    if theme not in THEMES:
        raise ValueError(f"unknown theme {theme!r}; known: {', '.join(THEMES)}")
    return read_text(f"{theme}.qss")


def icon_png(size: int) -> bytes:
    if size not in ICON_SIZES:
        raise ValueError(f"no {size}px icon; sizes: {ICON_SIZES}")
    return read_bytes(f"icons/opscope-{size}.png")
