"""OpScope: one import namespace over the fixed folder layout. The repository root is the
``opscope`` package (setuptools ``package-dir = {"opscope" = "."}``), so its folders are
``opscope.engine`` (engine/), ``opscope.app`` (app/), ``opscope.plugins`` (plugins/) and
``opscope.resources`` (resources/), and tools that walk a package's folder (import-linter,
PyInstaller, pkgutil) find them there.

``import opscope`` stays light (no torch, no Qt): the user API, ``opscope.step`` and
``opscope.region``, is imported on first use (PEP 562 module ``__getattr__``).
"""

from __future__ import annotations

__all__ = ["__version__", "region", "step"]

_LAZY = frozenset({"region", "step"})


def __getattr__(name: str):
    if name in _LAZY:
        from opscope.engine.trace import userapi  # torch comes with it: only when step/region are used

        value = getattr(userapi, name)
    elif name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            value = version("opscope")
        except PackageNotFoundError:  # a source tree that was never installed
            value = "0+unknown"
    else:
        raise AttributeError(f"module 'opscope' has no attribute {name!r}")
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
