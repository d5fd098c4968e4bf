"""The `opscope` command with the desktop app attached: engine.cli's parser, plus `opscope gui` and
`opscope` with no sub-command opening the window. The engine's CLI never imports Qt; this wrapper
is where the app joins it, and PySide6 is imported only when the window actually opens."""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from engine.cli import main as engine_main

    return engine_main(argv, gui=_gui)


def _gui(args) -> int:
    _check_display()
    from app.main import run  # PySide6 is imported only when the window opens

    return run(args)


def _check_display() -> None:
    """Qt aborts with 'Reinstalling the application may fix this problem' when it has no screen or
    lacks xcb-cursor; say what is really wrong, in one line, before Qt gets there."""
    import ctypes.util
    import os

    if not sys.platform.startswith("linux") or os.environ.get("QT_QPA_PLATFORM"):
        return
    from engine.errors import ConfigError

    if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        raise ConfigError("no display to open the window on (DISPLAY and WAYLAND_DISPLAY are unset): run it "
                          "in a desktop session, or use the headless commands (`opscope --help`)")
    missing = [pkg for lib, pkg in _XCB_LIBS.items() if ctypes.util.find_library(lib) is None]
    if not os.environ.get("WAYLAND_DISPLAY") and missing:
        raise ConfigError(f"Qt's X11 plugin needs system libraries that are missing: install them "
                          f"(Debian/Ubuntu: apt-get install {' '.join(missing)})")


# Libraries Qt 6's xcb platform plugin links against that desktops often lack → Debian package.
_XCB_LIBS = {"xcb-cursor": "libxcb-cursor0", "xcb-icccm": "libxcb-icccm4", "xcb-keysyms": "libxcb-keysyms1",
             "xcb-image": "libxcb-image0", "xcb-render-util": "libxcb-render-util0",
             "xkbcommon-x11": "libxkbcommon-x11-0", "xcb-randr": "libxcb-randr0", "xcb-shape": "libxcb-shape0"}


def entry() -> None:
    """Console-script entry point."""
    sys.exit(main())


if __name__ == "__main__":
    entry()
