"""engine/ never imports Qt: checked by import-linter's contracts and by a fresh interpreter."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_engine_import_loads_no_qt():
    code = ("import sys, opscope.engine.api, opscope.engine.cli, opscope.engine.generate, opscope.engine.formats; from opscope import engine; "
            "engine.cli.build_parser(); "
            "bad = [m for m in sys.modules if m.removeprefix('opscope.').split('.')[0] in ('PySide6', 'pyqtgraph', 'shiboken6', 'app')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_import_linter_contracts_hold():
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert exe, "import-linter is a test dependency"
    r = subprocess.run([exe], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:]
    assert "engine: entry points above the API" in r.stdout  # the layers contracts were checked


def test_public_api_is_importable_from_engine_api():
    """LoadedModel and LoadOptions live in engine.loaded (below the fast path, which builds them);
    engine.api re-exports them with load."""
    import opscope.engine.api
    from opscope import engine
    import opscope.engine.loaded
    from opscope import engine

    assert engine.api.LoadedModel is engine.loaded.LoadedModel
    assert engine.api.LoadOptions is engine.loaded.LoadOptions
    assert callable(engine.api.load) and callable(engine.api.fastpath_options)
