"""A kernel build that was killed leaves torch's cpp_extension `lock` file in its build directory;
the next build must not wait on it forever (engine/fastpath/kernels/build.py holds its own flock, which the
kernel releases when its holder dies, and drops the stale file).

The build compiles a one-function source through the same code path as the real kernels (variant,
build key, cache directory, flock, stale-lock removal, torch's `load` with its `lock` file, import):
what is tested is the locking, and the six real sources would take minutes to compile."""

from __future__ import annotations

import logging
import shutil

import pytest
from opscope.engine.fastpath.kernels import build

# torch's `load` passes the module name as TORCH_EXTENSION_NAME; Python.h only, so it compiles in a second
_TINY = r"""
#include <Python.h>
#define OPSCOPE_STR2(x) #x
#define OPSCOPE_STR(x) OPSCOPE_STR2(x)
#define OPSCOPE_CAT2(a, b) a##b
#define OPSCOPE_CAT(a, b) OPSCOPE_CAT2(a, b)
static PyObject *answer(PyObject *, PyObject *) { return PyLong_FromLong(42); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, nullptr}, {nullptr, nullptr, 0, nullptr}};
static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, OPSCOPE_STR(TORCH_EXTENSION_NAME), nullptr, -1, methods};
PyMODINIT_FUNC OPSCOPE_CAT(PyInit_, TORCH_EXTENSION_NAME)(void) { return PyModule_Create(&def); }
"""


@pytest.mark.timeout(300)  # a build that waits on the stale lock would wait forever
def test_a_stale_torch_lock_does_not_hang_the_next_build(tmp_path, monkeypatch, caplog):
    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler to build with")
    csrc = tmp_path / "csrc"
    csrc.mkdir()
    (csrc / "tiny.cpp").write_text(_TINY)
    monkeypatch.setattr(build, "CSRC", csrc)
    monkeypatch.setattr(build, "SOURCES", ("tiny.cpp",))
    monkeypatch.setattr(build, "_HEADERS", ())
    cache = tmp_path / "kernels"
    monkeypatch.setenv("OPSCOPE_KERNEL_CACHE", str(cache))
    monkeypatch.setenv("OPSCOPE_KERNEL_PREBUILT", str(tmp_path / "none"))  # no prebuilt fits: it builds
    name = build.module_name()
    (cache / name).mkdir(parents=True)
    (cache / name / "lock").write_text("")  # what a killed build leaves
    with caplog.at_level(logging.WARNING, logger=build.__name__):
        module = build._load_kernels.__wrapped__()  # the uncached load: this process's own kernels stay loaded
    assert module.answer() == 42
    assert module.__name__ == name
    assert not (cache / name / "lock").exists()
    assert f"removing {cache / name / 'lock'} left by an interrupted kernel build" in caplog.text
