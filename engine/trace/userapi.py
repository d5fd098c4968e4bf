"""The tiny API a user's own script calls to tell OpScope where its steps and regions are:

    import opscope
    for batch in loader:
        with opscope.region("forward"):
            loss = model(batch)
        ...
        opscope.step()          # one training step ends here

Outside `opscope trace -- python SCRIPT` both are near no-ops (one check of a module global), so a
script keeps them when it runs alone. Under a trace, ``step()`` ends a step of the report and
``region(name)`` is a phase on the trace's and the telemetry's time axis (engine.markers).
This module imports neither torch nor the trace: the tracer installs itself with ``_install``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from opscope.engine.core import markers

REGION = "region"  # the marker phase of a user region; its name is the marker's "region" attribute

_step_listener: Callable[[], None] | None = None


def step() -> None:
    """Mark the end of one step (a training iteration, a batch): the trace reports per step."""
    listener = _step_listener
    if listener is not None:
        listener()


@contextmanager
def region(name: str) -> Iterator[None]:
    """A named phase (``with opscope.region("data"): ...``), shown on the trace's time axis."""
    with markers.phase(REGION, region=str(name)):
        yield


def _install(listener: Callable[[], None] | None) -> Callable[[], None] | None:
    """Set the function ``step()`` calls (None: none); returns the previous one, to restore."""
    global _step_listener  # one tracer at a time per process, set and restored by the script runner
    previous, _step_listener = _step_listener, listener
    return previous
