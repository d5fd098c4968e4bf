"""The launcher: real ranks through torch's elastic agent (gloo, 2 processes); results, failures,
hangs. Ranks fork from one forkserver that imported torch once, so after the first launch each
costs well under a second."""
from __future__ import annotations

import os
import time

import pytest

from opscope.engine.distributed import LaunchSpec, launch
from opscope.engine.errors import ConfigError, DistributedError, EngineError


def _sum_of_ranks(offset):
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(dist.get_rank() + offset)])
    dist.all_reduce(t)
    return dist.get_rank(), dist.get_world_size(), t.item(), os.environ.get("OPSCOPE_LAUNCH_PROBE")


def _rank1_raises():
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise ValueError("planted failure")
    dist.barrier()  # rank 0 waits for a peer that is gone


def _rank1_hangs():
    import torch.distributed as dist

    if dist.get_rank() == 1:
        time.sleep(600)
    dist.barrier()


def _rank0_dies():
    import torch.distributed as dist

    if dist.get_rank() == 0:
        os._exit(3)
    dist.barrier()


def test_two_ranks_return_their_values_inside_an_initialised_group(monkeypatch):
    monkeypatch.setenv("OPSCOPE_LAUNCH_PROBE", "from-the-caller")  # set after any forkserver started
    got = launch(LaunchSpec(nproc=2, timeout_s=60), _sum_of_ranks, 10)
    # all_reduce of (0+10) and (1+10) is 21 on both ranks
    assert got == {0: (0, 2, 21.0, "from-the-caller"), 1: (1, 2, 21.0, "from-the-caller")}


def test_a_failing_rank_is_named_in_one_line_and_the_other_is_stopped():
    t0 = time.monotonic()
    with pytest.raises(DistributedError) as e:
        launch(LaunchSpec(nproc=2, timeout_s=60), _rank1_raises)
    msg = str(e.value)
    assert msg == "rank 1 failed: ValueError: planted failure; rank 0 stopped"
    assert isinstance(e.value, EngineError) and e.value.exit_code == 2
    assert time.monotonic() - t0 < 30  # rank 0 did not sit out its 60 s timeout


def test_a_hung_rank_times_out_with_one_line_naming_it():
    t0 = time.monotonic()
    with pytest.raises(DistributedError) as e:
        launch(LaunchSpec(nproc=2, timeout_s=3), _rank1_hangs)
    msg = str(e.value)
    assert msg.startswith("rank 1 failed: hung in test_launch.py:")
    assert "in _rank1_hangs: no result after the 3 s timeout; rank 0 stopped" in msg
    assert "\n" not in msg
    assert time.monotonic() - t0 < 20


def test_a_rank_that_exits_without_an_error_is_named():
    with pytest.raises(DistributedError) as e:
        launch(LaunchSpec(nproc=2, timeout_s=30), _rank0_dies)
    assert str(e.value).startswith("rank 0 failed: ")
    assert "exit" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("kwargs, fragment", [
    ({"nproc": 0}, "nproc 0"),
    ({"nproc": 2, "nnodes": 2}, "--rdzv-endpoint"),
    ({"nproc": 2, "nnodes": 2, "node_rank": 2, "rdzv_endpoint": "h:1"}, "node_rank 2"),
    ({"nproc": 2, "backend": "mpi"}, "backend 'mpi'"),
    ({"nproc": 2, "timeout_s": 0}, "timeout_s 0"),
])
def test_bad_specs_are_config_errors(kwargs, fragment):
    with pytest.raises(ConfigError, match=fragment):
        LaunchSpec(**kwargs)
