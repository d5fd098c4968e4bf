"""How `pytest -n 2 --dist loadfile` (`make test`) hands test files to its workers.

xdist's loadfile queue is ordered by the number of tests in a file; a long file with few tests then
starts last and one worker runs it alone while the other idles. Here a worker that asks for work
gets the longest file left (seconds measured on a quiet 2-core host, files not listed last, in
xdist's order), which keeps both busy to the end. The files whose tests watch the checkout
(conftest.TREE_WATCHED) run on one worker, before test_packaging.py, which then reads what they
recorded instead of running them again in a pytest of its own."""

from __future__ import annotations

import pytest

# Per file, its tests' seconds (setup, call, teardown) in `make test` on a quiet 2-core host.
SECONDS = {
    "tests/engine/fastpath/test_real_types.py": 145,
    "tests/test_gpu_check.py": 88,
    "tests/engine/fastpath/test_kernel_variants.py": 45,
    "tests/engine/models/test_families.py": 44,
    "tests/engine/models/test_engine_reference.py": 38,
    "tests/engine/trace/test_trace_model.py": 31,
    "tests/engine/generation/test_prefix_reuse.py": 36,
    "tests/engine/distributed/test_tp.py": 35,
    "tests/cli/test_signals_chat.py": 26,
    "tests/engine/trace/test_trace_script_gui.py": 31,
    "tests/plugins/test_plugins_mlx.py": 28,
    "tests/app/test_app.py": 25,
    "tests/engine/models/test_woq.py": 25,
    "tests/engine/bench/test_bench_crossover.py": 25,
    "tests/engine/fastpath/test_fastpath_peers.py": 25,
    "tests/cli/test_chat_stats.py": 25,
    "tests/engine/fastpath/test_kernels_portable.py": 24,
    "tests/engine/fastpath/test_kernels_types.py": 15,
    "tests/cli/test_full_disk.py": 22,
    "tests/cli/test_signals.py": 22,
    "tests/engine/store/test_store_errors.py": 21,
    "tests/engine/bench/test_bench_quality.py": 21,
    "tests/engine/trace/test_trace_script.py": 19,
    "tests/engine/bench/test_quick_budget.py": 18,
    "tests/engine/distributed/test_collectives.py": 18,
    "tests/app/test_app_bench_roofline.py": 18,
    "tests/engine/bench/test_bench_ab_panel.py": 17,
    "tests/engine/bench/test_ab_shared_memory.py": 17,
    "tests/engine/bench/test_bench_model.py": 16,
    "tests/app/test_app_mlx_trace.py": 16,
    "tests/engine/bench/test_bench_ab.py": 15,
    "tests/plugins/test_plugins_mlx_types.py": 15,
    "tests/engine/bench/test_compare_planted.py": 15,
    "tests/plugins/test_plugins_conformance.py": 14,
    "tests/app/test_app_diagnose_script.py": 14,
    "tests/engine/bench/test_bench_agreement.py": 14,
    "tests/engine/diagnose/test_diagnose_planted.py": 13,
    "tests/test_layering.py": 13,
    "tests/app/test_app_units.py": 13,
    "tests/cli/test_cli_flags.py": 13,
    "tests/engine/distributed/test_launch.py": 12,
    "tests/engine/bench/test_peers_llama_bench.py": 12,
    "tests/engine/fastpath/test_fastpath_model.py": 12,
    "tests/app/test_app_store.py": 11,
    "tests/engine/bench/test_bench_suites.py": 11,
    "tests/cli/test_signals_early.py": 11,
    "tests/cli/test_signals_fork.py": 11,
    "tests/engine/models/test_fuzz_models.py": 11,
    "tests/app/test_app_settings.py": 11,
    "tests/plugins/test_plugins_example.py": 11,
    "tests/engine/telemetry/test_telemetry_sampler.py": 11,
    "tests/engine/bench/test_bench_runner.py": 11,
    "tests/engine/models/test_compiled_decode.py": 10,
}
# One unit of work, run in collection order: the GUI tests the checkout is watched around, then
# the packaging test that reads their records. (test_packaging.py also builds and installs the wheel.)
TREE_GROUP = ("tests/app/test_app_panels.py", "tests/cli/test_cli_gui.py", "tests/test_packaging.py")
TREE_GROUP_SECONDS = 30 + 13 + 70


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
