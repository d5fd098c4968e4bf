"""The benchmark suites, by name. A suite module is imported only when it is used.

Each suite module defines ``NAME``, ``DESCRIPTION``, a frozen ``Params`` dataclass (its full
size) with a ``QUICK`` instance (a tiny size: the whole quick suite runs in under a minute on a
2-core CPU), and ``plan(opts: BenchOptions, params: Params | None) -> SuitePlan``.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from opscope.engine.core.errors import ConfigError

SUITES: dict[str, str] = {
    "llm": "llm",
    "kv-cache": "kv_cache",
    "batch": "batch",
    "attention": "attention",
    "matmul": "matmul",
    "bandwidth": "bandwidth",
    "train-step": "train_step",
    "scaling": "scaling",
    "peers": "peers",
    "crossover": "crossover",
    "collectives": "collectives",
}


def get_suite(name: str) -> ModuleType:
    try:
        module = SUITES[name]
    except KeyError as e:
        raise ConfigError(f"unknown benchmark suite {name!r}; choose one of: {', '.join(SUITES)}") from e
    return importlib.import_module(f"{__name__}.{module}")


def describe() -> dict[str, str]:
    """{suite name: one-line description}, for menus and `--help`."""
    return {name: get_suite(name).DESCRIPTION for name in SUITES}
