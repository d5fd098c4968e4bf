"""How `pytest -n 3 --dist loadfile` (`make test`) hands test files to its workers.

xdist's loadfile queue is ordered by the number of tests in a file; a long file with few tests then
starts last and one worker runs it alone while the others idle. Here a worker that asks for work
gets the longest file left (seconds measured on a 2-core host, files not listed last, in
xdist's order), which keeps every worker busy to the end. The files whose tests watch the checkout
(conftest.TREE_WATCHED) run on one worker, before test_packaging.py, which then reads what they
recorded instead of running them again in a pytest of its own."""

from __future__ import annotations

import pytest

# Per file, its tests' seconds (setup, call, teardown) in `pytest -n 3 --dist loadfile` on a 2-core
# host (2026-11-29, session 22, warm caches; files under 10 s left out).
SECONDS = {
    "tests/engine/fastpath/test_kernel_variants.py": 93,
    "tests/engine/fastpath/test_real_types.py": 71,
    "tests/engine/fastpath/test_kernels_portable.py": 61,
    "tests/engine/generation/test_prefix_reuse.py": 46,
    "tests/test_gpu_check.py": 45,
    "tests/engine/models/test_compiled_decode.py": 41,
    "tests/engine/distributed/test_tp.py": 38,
    "tests/engine/models/test_families.py": 35,
    "tests/app/test_app.py": 28,
    "tests/plugins/test_plugins_mlx.py": 25,
    "tests/engine/models/test_engine_reference.py": 25,
    "tests/engine/trace/test_trace_script.py": 20,
    "tests/engine/distributed/test_collectives.py": 19,
    "tests/engine/bench/test_bench_suites.py": 19,
    "tests/engine/bench/test_bench_quality.py": 18,
    "tests/plugins/test_plugins_mlx_types.py": 17,
    "tests/engine/models/test_fuzz_models.py": 17,
    "tests/engine/store/test_store_errors.py": 17,
    "tests/engine/bench/test_bench_ab.py": 16,
    "tests/engine/models/test_woq.py": 16,
    "tests/engine/distributed/test_launch.py": 14,
    "tests/cli/test_signals.py": 13,
    "tests/engine/bench/test_bench_crossover.py": 13,
    "tests/engine/bench/test_peers_llama_bench.py": 12,
    "tests/engine/bench/test_bench_model.py": 12,
    "tests/cli/test_signals_early.py": 12,
    "tests/app/test_app_units.py": 12,
    "tests/engine/bench/test_bench_runner.py": 11,
    "tests/app/test_app_settings.py": 11,
    "tests/engine/telemetry/test_telemetry_sampler.py": 11,
    "tests/cli/test_chat_stats.py": 10,
    "tests/engine/bench/test_compare_planted.py": 10,
    "tests/app/test_gui_readable.py": 10,
}
# One unit of work, run in collection order: the GUI tests the checkout is watched around, then
# the packaging test that reads their records. (test_packaging.py also builds and installs the wheel.)
TREE_GROUP = ("tests/app/test_app_panels.py", "tests/cli/test_cli_gui.py", "tests/test_packaging.py")
TREE_GROUP_SECONDS = 34 + 7 + 66


def scope_seconds(scope: str) -> int:
    return TREE_GROUP_SECONDS if scope == TREE_GROUP[0] else SECONDS.get(scope, 0)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile":
        return None  # xdist's own
    from xdist.scheduler import LoadFileScheduling

    # private hooks of xdist's class (3.x): where a later xdist lacks them, its own order runs
    if not all(hasattr(LoadFileScheduling, a) for a in ("_split_scope", "_assign_work_unit")):
        return None

    class LongestFileFirst(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return TREE_GROUP[0] if scope in TREE_GROUP else scope

        def _assign_work_unit(self, node) -> None:
            longest = max(self.workqueue, key=scope_seconds)  # ties: the first in xdist's queue
            self.workqueue.move_to_end(longest, last=False)
            super()._assign_work_unit(node)

    return LongestFileFirst(config, log)
