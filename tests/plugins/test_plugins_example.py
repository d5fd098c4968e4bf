"""The example plugin for authors: pip-installed into this environment, then discovered and used
through the `opscope` command exactly as a third-party plugin would be."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DIST = "opscope-example-backend"


def opscope(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "opscope.engine.cli.main", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=dict(os.environ),
        timeout=120,
    )


def installed() -> bool:
    try:
        importlib.metadata.distribution(DIST)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


@pytest.fixture(scope="module")
def example_installed(tmp_path_factory):
    """pip-install a copy of plugins/example_backend (a copy: the build leaves files behind);
    uninstall afterwards unless it was installed before the test."""
    was_installed = installed()
    if not was_installed:
        src = tmp_path_factory.mktemp("example") / "example_backend"
        shutil.copytree(
            ROOT / "plugins" / "example_backend",
            src,
            ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"),
        )
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index", str(src)],
            check=True,
            timeout=300,
        )
    yield
    if not was_installed:
        subprocess.run([sys.executable, "-m", "pip", "uninstall", "-q", "-y", DIST], check=True, timeout=120)


@pytest.mark.slow
def test_installed_example_is_discovered_and_generates(example_installed):
    out = opscope("plugins", "list", "--json")
    assert out.returncode == 0, out.stderr
    plugins = {p["name"]: p for p in json.loads(out.stdout)}
    echo = plugins["echo"]
    assert (echo["distribution"], echo["version"], echo["status"]) == (DIST, "0.1.0", "ok")
    assert echo["target"] == "opscope_example_backend:EchoBackend"
    assert {"torch", "mlx"} <= plugins.keys()
    out = opscope("generate", "--backend", "echo", "one two three", "-n", "4", "--ignore-eos")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("one two threeone")  # the prompt's tokens, echoed in a cycle
