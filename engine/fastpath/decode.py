"""Compiled decode step (placeholder until measured)."""
from __future__ import annotations


def compile_decode(model) -> None:
    raise NotImplementedError
