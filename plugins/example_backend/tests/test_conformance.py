"""Run the OpScope conformance kit against this plugin: `pytest plugins/example_backend/tests`."""

import pytest
from opscope.engine.testing.conformance import *  # noqa: F403  the kit's fixtures and tests


@pytest.fixture(scope="session")
def backend_name():
    return "echo"


@pytest.fixture(scope="session")
def conformance_backend():
    # Test the class directly, so the kit runs before the plugin is installed; once installed,
    # drop this fixture to test it exactly as users get it (engine.backends.get_backend).
    from opscope_example_backend import EchoBackend

    return EchoBackend()
