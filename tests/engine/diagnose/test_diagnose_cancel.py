"""A diagnosis stops when its cancel flag is set: at the next stage or after the decode step that
runs, with Cancelled and the app's wording; nothing after that stage runs and no run comes back."""

from __future__ import annotations

import threading

import pytest
from opscope.engine.core.errors import Cancelled
from opscope.engine.diagnose.measure import ModelPlan, Stages
from opscope.engine.diagnose.session import diagnose_model

SHORT = ModelPlan(prompt_tokens=8, tokens=3, trace_tokens=2)


class Watch:
    """Stages that set their own cancel flag when a stage named ``prefix…`` begins, and count the
    model's forward passes (a real forward hook) from then on."""

    def __init__(self, model, prefix: str) -> None:
        self.cancel, self.prefix, self.seen = threading.Event(), prefix, []
        self.passes, self.passes_at_cancel = 0, None
        self._hook = model.register_forward_hook(self._count)

    def _count(self, *_args) -> None:
        self.passes += 1

    def on_stage(self, stage: str) -> None:
        self.seen.append(stage)
        if stage.startswith(self.prefix):
            self.passes_at_cancel = self.passes
            self.cancel.set()

    def stages(self) -> Stages:
        return Stages(self.cancel, self.on_stage)

    def close(self) -> None:
        self._hook.remove()


@pytest.fixture
def watch(tiny_lm):
    made = []
    yield lambda prefix: made.append(Watch(tiny_lm.model, prefix)) or made[-1]
    for w in made:
        w.close()


def test_stages_are_told_in_order_as_they_begin(tiny_lm, watch):
    w = watch("no such stage")
    diagnose_model(tiny_lm, SHORT, "tiny", None, stages=w.stages())
    assert w.seen == [
        "tracing a prefill of 8 tokens and 2 decode steps",
        "timing a prefill of 8 tokens and 3 decode steps",
        "probing the compute and bandwidth ceilings",
        "measuring the host cost of one op",
    ]


@pytest.mark.parametrize(
    "at, plan",
    [
        # 500 decode steps in the stage that is cancelled: the model's passes show whether it stopped
        ("tracing", ModelPlan(prompt_tokens=8, tokens=3, trace_tokens=500)),
        ("timing", ModelPlan(prompt_tokens=8, tokens=500, trace_tokens=2)),
        ("probing", SHORT),
        ("measuring", SHORT),
    ],
)
def test_a_cancel_during_a_stage_stops_the_diagnosis_there(tiny_lm, watch, at, plan):
    w = watch(at)
    with pytest.raises(Cancelled) as e:
        diagnose_model(tiny_lm, plan, "tiny", None, stages=w.stages())
    assert str(e.value) == "diagnosis cancelled; nothing was saved"
    assert w.seen[-1].startswith(at)
    # the prefill and at most one decode step after the flag was set, not the other 499
    assert w.passes - w.passes_at_cancel <= 2


def test_a_cancel_set_before_it_starts_runs_nothing(tiny_lm, watch):
    w = watch("")
    w.cancel.set()
    with pytest.raises(Cancelled):
        diagnose_model(tiny_lm, SHORT, "tiny", None, stages=w.stages())
    assert (w.seen, w.passes) == ([], 0)
