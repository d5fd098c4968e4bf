"""The conformance kit run for the built-in backends, exactly as a plugin author runs it."""

from __future__ import annotations

import pytest
from opscope.engine.testing.conformance import *  # noqa: F403  the kit's fixtures and tests

pytestmark = pytest.mark.slow  # loads the default model per backend


@pytest.fixture(scope="session", params=["torch", "mlx"])
def backend_name(request):
    return request.param


@pytest.fixture(scope="session")
def conformance_model(backend_name, conformance_backend, conformance_device, request):
    if backend_name == "torch":
        return request.getfixturevalue("lm")  # the session's shared torch model: load it once
    # The default model's first 2 layers (its tokenizer, template and weights): the kit checks the
    # backend's contract, which holds at any depth; MLX parity on the whole model is in test_plugins_mlx.
    path = request.getfixturevalue("default_model_2_layers")
    return conformance_backend.load(str(path), device=conformance_device, dtype="float32")
