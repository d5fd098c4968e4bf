"""The launcher: real ranks through torch's elastic agent (gloo, 2 processes); results, failures,
hangs. Ranks fork from one forkserver that imported torch once, so after the first launch each
costs well under a second."""

from __future__ import annotations

import os
import time

import pytest
from opscope.engine.core.errors import ConfigError, DistributedError, EngineError
from opscope.engine.distributed import LaunchSpec, launch


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


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"nproc": 0}, "nproc 0"),
        ({"nproc": 2, "nnodes": 2}, "--rdzv-endpoint"),
        ({"nproc": 2, "nnodes": 2, "node_rank": 2, "rdzv_endpoint": "h:1"}, "node_rank 2"),
        ({"nproc": 2, "backend": "mpi"}, "backend 'mpi'"),
        ({"nproc": 2, "timeout_s": 0}, "timeout_s 0"),
    ],
)
def test_bad_specs_are_config_errors(kwargs, fragment):
    with pytest.raises(ConfigError, match=fragment):
        LaunchSpec(**kwargs)


def test_the_agents_own_loggers_are_quiet_during_a_launch():
    """torch's elastic loggers set their own level (LOGLEVEL, default WARNING): the agent's "Received
    2 death signal, shutting down workers" would print before our one line on Ctrl-C."""
    import logging

    import torch.distributed.elastic.agent.server.api  # noqa: F401  (creates the agent's logger)
    from opscope.engine.distributed.launch import _quiet_agent

    agent = logging.getLogger("torch.distributed.elastic.agent.server.api")
    assert agent.isEnabledFor(logging.WARNING)
    with _quiet_agent():
        assert not agent.isEnabledFor(logging.WARNING)
    assert agent.isEnabledFor(logging.WARNING)


def test_ctrl_c_while_the_forkserver_imports_torch_is_one_line(tmp_path):
    """A terminal's Ctrl-C reaches the whole process group, the forkserver still importing torch
    included: one line of ours, exit 130, no traceback from the server, no rank left behind."""
    import signal
    import subprocess
    import sys

    import psutil

    err = tmp_path / "err.txt"
    code = "import sys; from opscope.engine.cli.main import main; sys.exit(main(sys.argv[1:]))"
    with open(err, "a") as f:
        p = subprocess.Popen(
            [sys.executable, "-c", code, "generate", "hi", "-n", "4", "--nproc", "3"],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=f,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    server = None
    deadline = time.monotonic() + 60
    while server is None and p.poll() is None and time.monotonic() < deadline:
        server = next(
            (c for c in psutil.Process(p.pid).children() if "multiprocessing.forkserver" in " ".join(c.cmdline())), None
        )
        time.sleep(0.02)
    assert server is not None, err.read_text()
    os.killpg(p.pid, signal.SIGINT)  # the server takes seconds to import torch: it is importing now
    assert p.wait(timeout=60) == 130
    time.sleep(0.5)  # a KeyboardInterrupt in the server's import prints at once
    text = err.read_text()
    server.kill()  # still importing torch; it would leave by itself once done (CI time)
    assert text.splitlines() == ["opscope: interrupted"], text


def test_the_launch_config_fits_torch_versions_without_a_shutdown_timeout(monkeypatch):
    """torch 2.11 (the first GPU machine's, docs/gpu.md) has no LaunchConfig.shutdown_timeout: the
    keyword made every --nproc run an internal error there."""
    import dataclasses
    import importlib

    launch_module = importlib.import_module("opscope.engine.distributed.launch")
    from torch.distributed.launcher import api

    spec = LaunchSpec(nproc=2)
    assert launch_module._launch_config(spec, None).shutdown_timeout == launch_module._SHUTDOWN_S
    older = [(f.name, f.type, f) for f in dataclasses.fields(api.LaunchConfig) if f.name != "shutdown_timeout"]
    monkeypatch.setattr(api, "LaunchConfig", dataclasses.make_dataclass("LaunchConfig", older))
    config = launch_module._launch_config(spec, None)
    assert config.nproc_per_node == 2 and not hasattr(config, "shutdown_timeout")
