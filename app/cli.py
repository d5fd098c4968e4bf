"""The `opscope` command with the desktop app attached: engine.cli's parser, plus `opscope gui` and
`opscope` with no sub-command opening the window. The engine's CLI never imports Qt; this wrapper
is where the app joins it, and PySide6 is imported only when the window actually opens."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    whole_process = argv is None  # the console script: the process ends when this returns
    original = exit_on_signals() if whole_process else {}
    from functools import partial

    try:
        from opscope.engine import cli_main as engine_main  # installs the one-line Ctrl-C handling
    except KeyboardInterrupt:
        print("opscope: interrupted", file=sys.stderr)
        return 130
    argv, screenshot = split_screenshot(sys.argv[1:] if argv is None else list(argv))
    try:
        code = engine_main(argv, gui=partial(_gui, screenshot=screenshot), whole_process=whole_process)
    except KeyboardInterrupt as e:  # in the few steps before engine.cli's own handling, or after it
        from opscope.engine import Terminated

        terminated = isinstance(e, Terminated)
        print(f"opscope: {'terminated' if terminated else 'interrupted'}", file=sys.stderr)
        code = 143 if terminated else 130
    if whole_process:  # a Ctrl-C during interpreter shutdown must not print a traceback
        import signal

        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for sig, handler in original.items():
            if sig != signal.SIGINT:
                signal.signal(sig, handler)
    return code


def exit_on_signals() -> dict:
    """The first thing the `opscope` process does (before importing anything heavy): until
    engine.cli's main takes over (it turns the signals into exceptions for its clean-up), there is
    nothing to clean up, so Ctrl-C or SIGTERM print their one line and exit 130/143 at once,
    without a traceback, whatever import is running. A signal the parent set to be ignored (a
    background job) stays ignored. Returns the handlers it replaced.

    It uses _signal, the C module the interpreter has already loaded, not `signal`, whose import
    (three enum conversions) would be one more step where a Ctrl-C meets Python's own handler
    (a KeyboardInterrupt traceback, then death by SIGINT)."""
    import _signal

    replaced = {}
    for sig in (_signal.SIGINT, _signal.SIGTERM):
        handler = _signal.getsignal(sig)
        if handler != _signal.SIG_IGN:
            replaced[sig] = _signal.SIG_DFL if handler is None else handler
            _signal.signal(sig, _exit_at_once)
    return replaced


def _exit_at_once(signum: int, _frame) -> None:
    import _signal
    import os

    os.write(2, b"opscope: interrupted\n" if signum == _signal.SIGINT else b"opscope: terminated\n")
    os._exit(128 + signum)


def _gui(args, screenshot: str | None = None) -> int:
    _check_display()
    from opscope.app.main import run  # PySide6 is imported only when the window opens

    if screenshot is not None:
        args.screenshot = screenshot
    return run(args)


def split_screenshot(argv: list[str]) -> tuple[list[str], str | None]:
    """Take the window-only option ``--screenshot PATH`` out of ``opscope [gui] …`` before the
    engine's parser (which knows nothing of windows) sees it; other commands keep their argv."""
    from opscope.engine import command_word

    command = command_word(argv)
    if command not in (None, "gui"):
        return argv, None
    out, path, i = [], None, 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--screenshot" and i + 1 < len(argv):
            path, i = argv[i + 1], i + 2
            continue
        if arg.startswith("--screenshot="):
            path = arg.split("=", 1)[1]
        else:
            out.append(arg)
        i += 1
    return out, path


def _check_display() -> None:
    """Qt aborts with 'Reinstalling the application may fix this problem' when it has no screen or
    lacks xcb-cursor; say what is really wrong, in one line, before Qt gets there."""
    import ctypes.util
    import os

    if not sys.platform.startswith("linux") or os.environ.get("QT_QPA_PLATFORM"):
        return
    from opscope.engine import ConfigError

    if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        raise ConfigError(
            "no display to open the window on (DISPLAY and WAYLAND_DISPLAY are unset): run it "
            "in a desktop session, or use the headless commands (`opscope --help`)"
        )
    missing = [pkg for lib, pkg in _XCB_LIBS.items() if ctypes.util.find_library(lib) is None]
    if not os.environ.get("WAYLAND_DISPLAY") and missing:
        raise ConfigError(
            f"Qt's X11 plugin needs system libraries that are missing: install them "
            f"(Debian/Ubuntu: apt-get install {' '.join(missing)})"
        )


# Libraries Qt 6's xcb platform plugin links against that desktops often lack → Debian package.
_XCB_LIBS = {
    "xcb-cursor": "libxcb-cursor0",
    "xcb-icccm": "libxcb-icccm4",
    "xcb-keysyms": "libxcb-keysyms1",
    "xcb-image": "libxcb-image0",
    "xcb-render-util": "libxcb-render-util0",
    "xkbcommon-x11": "libxkbcommon-x11-0",
    "xcb-randr": "libxcb-randr0",
    "xcb-shape": "libxcb-shape0",
}


def entry() -> None:
    """Console-script entry point."""
    sys.exit(main())


if __name__ == "__main__":
    entry()
