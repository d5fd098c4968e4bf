"""Start the OpScope window: ``opscope gui``, ``opscope`` with no sub-command, ``python -m opscope.app``.

``run(args)`` accepts the lead CLI's argparse namespace (model/device/dtype/backend/db attributes
when present) or a list of command-line strings. A frozen bundle starts its engine worker by
running itself with ``--engine-worker``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

log = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="opscope gui", description="Open the OpScope workbench window.")
    p.add_argument("--model", help="GGUF file or Hugging Face directory (default: the embedded model)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--backend", default="torch")
    p.add_argument(
        "--db",
        help="run store URL (default: $OPSCOPE_DB, else the store last opened in the Runs "
        "panel, else the user's SQLite database)",
    )
    p.add_argument("--theme", choices=("system", "light", "dark"), help="override the system theme")
    p.add_argument("--debug", action="store_true", help="verbose logging")
    p.add_argument(
        "--screenshot",
        metavar="PATH",
        help="wait until the engine is idle (model loaded or failed), write a PNG of the window to PATH and exit",
    )
    return p


def _options(args: argparse.Namespace | Sequence[str] | None) -> argparse.Namespace:
    if args is None:
        args = sys.argv[1:]
    if isinstance(args, argparse.Namespace):
        defaults = vars(build_parser().parse_args([]))
        return argparse.Namespace(
            **{k: getattr(args, k, v) if getattr(args, k, None) is not None else v for k, v in defaults.items()}
        )
    return build_parser().parse_args(list(args))


def run(args: argparse.Namespace | Sequence[str] | None = None) -> int:
    """Open the window and run the event loop; returns the exit code."""
    if isinstance(args, (list, tuple)) and "--engine-worker" in args:
        from opscope.app.worker.main import main as worker_main

        return worker_main()
    opts = _options(args)
    if opts.screenshot:
        from opscope.app.window.screenshot import unwritable_reason

        if (why := unwritable_reason(opts.screenshot)) is not None:
            print(f"opscope: error: cannot write the screenshot to {opts.screenshot}: {why}", file=sys.stderr)
            return 2
    logging.basicConfig(
        level=logging.DEBUG if opts.debug else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    from opscope.app.ui import settings
    from opscope.app.ui.engine_client import EngineClient
    from opscope.app.ui.theme import ThemeManager, app_icon
    from opscope.app.window.main_window import MainWindow
    from opscope.app.window.stop_signals import CloseOnSignal
    from opscope.app.worker.protocol import LoadRequest
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication([sys.argv[0]])
    app.setApplicationName("OpScope")
    app.setDesktopFileName("opscope")  # matches resources/opscope.desktop (Wayland app id)
    app.setWindowIcon(app_icon())
    theme = ThemeManager(app, opts.theme or str(settings.value("ui/theme", "system")))
    spec = LoadRequest(model=opts.model, device=opts.device, dtype=opts.dtype, backend=opts.backend)
    # --db wins; otherwise the store last opened from the Runs panel (None: the default SQLite file).
    db_url = opts.db or os.environ.get("OPSCOPE_DB") or str(settings.value("runs/store", "") or "") or None
    window = MainWindow(EngineClient(), theme, db_url=db_url, initial_model=spec)
    window.show()
    if opts.screenshot:
        from opscope.app.window.screenshot import ScreenshotWhenIdle

        ScreenshotWhenIdle(window, opts.screenshot)
    stops = CloseOnSignal(lambda: (window.close(), app.quit()))
    try:
        code = app.exec()
        close_window(window)
    finally:
        stops.uninstall()
    if stops.exit_code is not None:
        from opscope.engine import stderr_line

        stderr_line(stops.line)
        return stops.exit_code
    return code


def close_window(window) -> None:
    """Delete the window (its plots, the worker) while Qt still runs: left to the interpreter's
    exit, pyqtgraph's scene items can be freed in an order that crashes the process."""
    from PySide6.QtCore import QCoreApplication, QEvent

    window.close()
    window.deleteLater()
    QCoreApplication.sendPostedEvents(None, QEvent.DeferredDelete)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m opscope.app`` and a bundle's engine worker: returns the exit code."""
    return run(sys.argv[1:] if argv is None else list(argv))


if __name__ == "__main__":
    sys.exit(main())
