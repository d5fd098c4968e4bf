"""PyInstaller's entry script: the window, or (with --engine-worker) the engine worker process,
which a frozen app starts by running itself again (app.engine_client.worker_command)."""
from app.main import main

if __name__ == "__main__":
    main()
