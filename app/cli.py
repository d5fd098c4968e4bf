"""The `opscope` command with the desktop app attached: engine.cli's parser, plus `opscope gui` and
`opscope` with no sub-command opening the window. The engine's CLI never imports Qt; this wrapper
is where the app joins it, and PySide6 is imported only when the window actually opens."""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from engine.cli import main as engine_main

    from app.main import run

    return engine_main(argv, gui=run)


def entry() -> None:
    """Console-script entry point."""
    sys.exit(main())


if __name__ == "__main__":
    entry()
