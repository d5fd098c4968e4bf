"""What the entry points' docstrings promise exists, and `python -m opscope.app` exits with the window's code."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_app_main_returns_the_exit_code(tmp_path):
    from opscope.app.main import main

    # a screenshot that cannot be written is refused before Qt starts: exit 2, returned, not raised
    assert main(["--screenshot", str(tmp_path / "missing" / "shot.png")]) == 2


def test_python_m_opscope_app_exits_with_mains_code(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "opscope.app", "--screenshot", str(tmp_path / "missing" / "x.png")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "cannot write the screenshot" in r.stderr, r.stderr


def test_docstrings_name_the_module_that_runs():
    for path in (ROOT / "app" / "main.py", ROOT / "app" / "__main__.py"):
        text = path.read_text()
        assert "python -m opscope.app" in text and "python -m app`" not in text, path


def test_gguf_craft_docstring_names_only_what_exists():
    import gguf_craft

    named = re.findall(r"``(?:Craft\.)?(\w+)(?:\(\))?``", gguf_craft.__doc__)
    assert named, gguf_craft.__doc__
    missing = [
        n
        for n in named
        if not hasattr(gguf_craft, n)
        and not hasattr(gguf_craft.Craft, n)
        and n not in gguf_craft.Craft.__dataclass_fields__
        and n != "gguf"
    ]
    assert not missing, missing  # before: ``layout()``, which does not exist
