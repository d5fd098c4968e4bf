"""Fixtures of the model-file tests: the valid tiny GGUF the hostile-file tests damage one field at
a time, written once per module, and a fresh editable Craft of it per test."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from gguf_craft import Craft


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    from opscope.engine.testing.gguf_writer import hf_config, write_gguf

    return write_gguf(tmp_path_factory.mktemp("valid") / "tiny.gguf", hf_config("llama"), types="Q8_0")


@pytest.fixture(scope="module")
def _craft(tiny) -> Craft:
    return Craft.read(tiny)


@pytest.fixture
def craft(_craft) -> Craft:
    return copy.deepcopy(_craft)
