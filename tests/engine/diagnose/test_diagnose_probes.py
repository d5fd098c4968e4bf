"""engine.diagnose.probes.matvec_modes on the embedded model's real fast path: which matvecs it times,
in which modes, and where it has nothing to compare."""

from opscope.engine import load
from opscope.engine.diagnose.probes import matvec_modes
from opscope.engine.fastpath.qlinear import QuantLinear


def test_the_exact_fast_path_s_matvecs_are_timed_in_both_modes_with_their_types():
    lm = load(threads=1)  # auto: the fast path, exact float32
    linears = [m for m in lm.model.modules() if isinstance(m, QuantLinear)]
    assert linears and all(m.act_mode == 0 for m in linears)
    with_int8 = {m.ggml_type for m in linears if m.int8_kernel}  # what this CPU's kernels have
    modes = matvec_modes(lm.model)
    if not with_int8:  # e.g. the baseline variant: no int8 kernels, nothing to compare
        assert modes is None
        return
    assert modes.exact_ms > 0 and modes.int8_ms > 0
    # by weights, most first: the embedded model's layers are Q4_1, its tied head Q8_0
    assert modes.types.split(", ") == [t for t in ("Q4_1", "Q8_0") if t in with_int8]


def test_nothing_to_compare_with_int8_activations_already_or_the_plain_model():
    assert matvec_modes(load(threads=1, fastpath="activations=q8").model) is None
    assert matvec_modes(load(threads=1, fastpath="off").model) is None
