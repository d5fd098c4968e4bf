"""Planted-bug variants of a loaded model, made by swapping modules (the bugs live in
engine/trace/planted.py, so reports name that file and line):

  clean             the model as loaded
  leaky-norm        every RMSNorm computes on the CPU and copies back
  per-element-copy  the final norm's output is rebuilt element by element through .item()

``plant(model, name)`` swaps them in for the duration of a with-block and restores the model.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from opscope.engine.core.errors import ConfigError

if TYPE_CHECKING:  # torch is imported on use: the CLI lists the variants without it
    from torch import nn

log = logging.getLogger(__name__)

CLEAN, LEAKY_NORM, PER_ELEMENT_COPY = "clean", "leaky-norm", "per-element-copy"
VARIANTS = (CLEAN, LEAKY_NORM, PER_ELEMENT_COPY)


def _norm_paths(model: nn.Module) -> list[str]:
    """RMSNorm modules: a class named *RMSNorm, or a *norm leaf with a 1-D weight and no bias."""
    paths = []
    for path, module in model.named_modules():
        leaf = path.rsplit(".", 1)[-1]
        weight = getattr(module, "weight", None)
        looks_like = (
            leaf.endswith("norm")
            and weight is not None
            and weight.dim() == 1
            and getattr(module, "bias", None) is None
            and not list(module.children())
        )
        if type(module).__name__.endswith("RMSNorm") or looks_like:
            paths.append(path)
    return paths


def _final_norm_path(model: nn.Module) -> str:
    norms = [p for p in _norm_paths(model) if "." not in p]
    if not norms:
        raise ConfigError(f"{type(model).__name__} has no top-level norm module to plant per-element-copy in")
    return norms[-1]


def swaps_for(model: nn.Module, variant: str) -> dict[str, nn.Module]:
    """path → replacement module for a variant (empty for clean)."""
    from opscope.engine.trace.planted import LeakyRMSNorm, PerElementCopy

    if variant == CLEAN:
        return {}
    if variant == LEAKY_NORM:
        paths = _norm_paths(model)
        if not paths:
            raise ConfigError(f"{type(model).__name__} has no RMSNorm modules to plant leaky-norm in")
        return {p: LeakyRMSNorm(model.get_submodule(p)) for p in paths}
    if variant == PER_ELEMENT_COPY:
        path = _final_norm_path(model)
        return {path: PerElementCopy(model.get_submodule(path))}
    raise ConfigError(f"unknown variant {variant!r}: expected one of {', '.join(VARIANTS)}")


def _set(model: nn.Module, path: str, module: nn.Module) -> nn.Module:
    parent_path, _, leaf = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    old = getattr(parent, leaf)
    setattr(parent, leaf, module)
    return old


@contextmanager
def plant(model: nn.Module, variant: str) -> Iterator[list[str]]:
    """Swap the variant's modules into ``model``; yields the swapped paths; restores on exit."""
    originals = {path: _set(model, path, new) for path, new in swaps_for(model, variant).items()}
    log.info("variant %s: swapped %d module(s)", variant, len(originals))
    try:
        yield list(originals)
    finally:
        for path, old in originals.items():
            _set(model, path, old)
