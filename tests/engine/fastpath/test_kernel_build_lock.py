"""A kernel build that was killed leaves torch's cpp_extension `lock` file in its build directory;
the next build must not wait on it forever (engine/fastpath/kernels/build.py holds its own flock, which the
kernel releases when its holder dies, and drops the stale file)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from opscope.engine.fastpath.kernels import build


def test_a_stale_torch_lock_does_not_hang_the_next_build(tmp_path):
    build.load_kernels()  # the machine's variant (prebuilt by `make setup`, compiled in the cache)
    name = build.module_name()
    src = build.cache_root() / name
    if not src.is_dir():
        pytest.skip(f"no compiled build of {name} in {build.cache_root()} to start from (`make setup` makes one)")
    cache = tmp_path / "kernels"
    # the object files stay, so the rebuild only links (seconds); the module and a dead build's lock
    # are what a killed build leaves
    shutil.copytree(src, cache / name, ignore=shutil.ignore_patterns("*.so", "lock"))
    (cache / name / "lock").write_text("")
    code = "from opscope.engine.fastpath.kernels.build import load_kernels; load_kernels(); print('loaded')"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**_env(), "OPSCOPE_KERNEL_CACHE": str(cache), "OPSCOPE_KERNEL_PREBUILT": str(tmp_path / "none")},
    )  # no prebuilt fits: it builds
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "loaded"
    assert not (cache / name / "lock").exists()
    assert "left by an interrupted kernel build" in out.stderr


def _env():
    import os

    return dict(os.environ)
