"""PyInstaller's entry script. The one executable of a bundle is three things:
- the engine worker, which the window starts by running the bundle again with ``--engine-worker``
  (app.engine_client.worker_command);
- the window: no arguments, window options only, or ``gui`` (``opscope-gui``, ``opscope-gui gui
  --screenshot window.png``);
- the headless ``opscope`` command: ``opscope-gui generate "Hello" -n 8``, ``opscope-gui models inspect``.
"""

import sys


def main() -> None:
    if "--engine-worker" in sys.argv[1:]:
        from opscope.app.main import main as window_or_worker

        sys.exit(window_or_worker())
    from opscope.app.cli import main as cli

    sys.exit(cli())


if __name__ == "__main__":
    main()
