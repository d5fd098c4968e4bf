"""engine/ never imports Qt: checked by import-linter's contracts and by a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_engine_import_loads_no_qt():
    code = (
        "import sys, opscope.engine.api, opscope.engine.cli.main, opscope.engine.generation.generate, opscope.engine.formats; from opscope import engine; "
        "engine.cli.main.build_parser(); "
        "bad = [m for m in sys.modules if m.removeprefix('opscope.').split('.')[0] in ('PySide6', 'pyqtgraph', 'shiboken6', 'app')]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_public_api_is_importable_from_engine_api():
    """LoadedModel and LoadOptions live in engine.generation.loaded (below the fast path, which
    builds them); engine.api re-exports them with load."""
    import opscope.engine.api
    import opscope.engine.generation.loaded  # noqa: F401  (sets engine.generation.loaded)
    from opscope import engine

    assert engine.api.LoadedModel is engine.generation.loaded.LoadedModel
    assert engine.api.LoadOptions is engine.generation.loaded.LoadOptions
    assert callable(engine.api.load) and callable(engine.api.fastpath_options)


def test_every_public_name_resolves_and_the_package_import_stays_light():
    """opscope.engine is the API the app and plugins import (import-linter holds them to it, `make
    lint`): each name it lists resolves, and importing it imports neither torch nor SQLAlchemy."""
    code = (
        "import sys, opscope.engine as e; print(sorted(m for m in ('torch', 'sqlalchemy') if m in sys.modules)); "
        "[getattr(e, n) for n in e.__all__]; print('ok')"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["[]", "ok"]
