"""Helpers for tests and scripts that drive the real window (pytest-qt tests use qtbot instead of
``wait_until`` wherever a qtbot exists; module-scoped fixtures cannot have one)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from opscope.app.worker.protocol import LoadRequest


def wait_until(app, predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Process events until ``predicate()`` holds; AssertionError naming ``what`` after the timeout."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        app.processEvents()
        time.sleep(0.005)  # processEvents returns at once when idle; do not spin a core


def close_window(window) -> None:
    from opscope.app.main import close_window as close

    close(window)


def open_window(
    app, base: Path, *, theme: str = "light", threads: int | None = 1, timeout_s: float = 240, backend: str = "torch"
):
    """The main window on a fresh settings dir and run store under ``base``, with the default model
    loaded on ``backend`` (``threads=1`` leaves a core for the GUI on a 2-core machine)."""
    from opscope.app.ui import settings
    from opscope.app.ui.engine_client import EngineClient
    from opscope.app.ui.theme import ThemeManager
    from opscope.app.window.main_window import MainWindow

    settings.use_directory(str(base / "settings"))
    window = MainWindow(
        EngineClient(),
        ThemeManager(app, theme),
        db_url=f"sqlite:///{base / 'runs.db'}",
        initial_model=LoadRequest(threads=threads, backend=backend),
    )
    window.resize(1400, 900)
    window.show()
    wait_until(
        app,
        lambda: window.client.model_info is not None or not window.client.busy,
        timeout_s,
        "the default model to load",
    )
    if window.client.model_info is None:  # say why at once instead of waiting out the timeout
        errors = [n.message for n in window.notifier.history if n.level == "error"]
        raise AssertionError(f"the default model did not load: {errors or window.client.worker_output()}")
    return window
