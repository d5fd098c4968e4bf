"""Models the diagnose tests share: a tiny random llama GGUF (written once) and it loaded on plain
torch (loaded once; shared: do not mutate it)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory) -> Path:
    from opscope.engine.testing.gguf_writer import hf_config, write_gguf

    return write_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf", hf_config("llama"), types="F16")


@pytest.fixture(scope="session")
def tiny_lm(tiny_gguf):
    from opscope.engine.api import load

    return load(tiny_gguf, fastpath="off")
