"""A first kernel build takes minutes with a silent compiler: the `opscope` command says when it
starts and ends, one line each on stderr, at the CLI's default (WARNING) log level."""

from __future__ import annotations

import functools
import logging

from opscope.engine.cli.main import main
from opscope.engine.fastpath.kernels import build


def test_a_kernel_build_says_it_starts_and_ends(tmp_path, monkeypatch, capsys):
    # A real build with an empty cache, ended at once by the machine having no compiler on PATH.
    monkeypatch.setenv("OPSCOPE_KERNEL_CACHE", str(tmp_path / "kernels"))
    monkeypatch.setenv("PATH", str(tmp_path / "no-compiler-here"))
    monkeypatch.setenv("OPSCOPE_KERNEL_PREBUILT", str(tmp_path / "none"))  # a platform no prebuilt variant covers
    # this process may have loaded (or failed) the kernels already: a fresh cache for this test,
    # the process's own put back after it
    monkeypatch.setattr(build, "_load_kernels", functools.lru_cache(maxsize=1)(build._load_kernels.__wrapped__))
    monkeypatch.setattr(build, "_failure", None)
    capsys.readouterr()
    assert main(["fastpath", "build"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "opscope: building CPU kernels for this machine (first run only, a few minutes)…", err
    assert err[1].startswith("opscope: building CPU kernels failed after "), err
    assert err[2].startswith("opscope: error: no C++ compiler found"), err
    assert len(err) == 3 and logging.getLogger().level == logging.WARNING, err
