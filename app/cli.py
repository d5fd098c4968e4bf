"""Entry point of the `opscope` command: the engine's CLI plus `gui` (the default with no command)."""
from __future__ import annotations

import sys


def _gui(args) -> int:
    from app.main import run  # Qt is imported only when the window is wanted

    return run(args)


def main(argv: list[str] | None = None) -> int:
    from engine.cli import main as engine_main

    return engine_main(argv, gui=_gui)


if __name__ == "__main__":
    sys.exit(main())
