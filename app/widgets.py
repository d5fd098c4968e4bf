"""Small helpers that keep what a person reads whole at 1400x900."""
from __future__ import annotations

import os
from typing import Callable

TICK_GAP_PX = 12  # room between two category labels on an axis


def category_ticks(names: list[str], axis_px: int, text_px: Callable[[str], int],
                   numbers: list[int] | None = None) -> tuple[list[str], bool]:
    """Labels for category ticks that never overlap: the names less their shared prefix when they
    fit side by side in ``axis_px``, else the row numbers ``numbers`` (1-based, as a table's row
    header shows them). Returns the labels and whether they are numbers."""
    if len(names) > 1:
        prefix = os.path.commonprefix(names)
        prefix = prefix[:prefix.rfind("_") + 1]  # cut at a word boundary: "matmul_", never "matmul_f"
        short = [n[len(prefix):] or n for n in names]
    else:
        short = list(names)
    if sum(text_px(s) + TICK_GAP_PX for s in short) <= axis_px:
        return short, False
    return [str(i) for i in (numbers or range(1, len(names) + 1))], True
