"""A Ctrl-C just as the tensor-parallel ranks are forked (`--nproc 2`): one line, exit 130, no
traceback from a rank that was being born, and no process of the job left behind.

The child's own test hook sends the terminal's Ctrl-C (SIGINT to the whole process group) right after
the forkserver has forked the first rank, while that rank still unpickles what it was handed
(multiprocessing.popen_forkserver.Popen._launch): the launcher stops and exits, unlinking the named
semaphore the rank was reading, which printed the forkserver's FileNotFoundError traceback.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

CTRL_C_AT_THE_FORK = """
import os, signal, sys
import multiprocessing.popen_forkserver as pf

_launch = pf.Popen._launch

def launch_then_ctrl_c(self, process_obj):
    _launch(self, process_obj)
    if not getattr(pf, "ctrl_c_sent", False):
        pf.ctrl_c_sent = True
        os.killpg(0, signal.SIGINT)

pf.Popen._launch = launch_then_ctrl_c
if __name__ == "__main__":  # the forkserver imports this main module again
    from opscope.engine.cli.main import main
    sys.exit(main())
"""


@pytest.fixture(scope="module")
def two_kv_heads_gguf(tmp_path_factory):
    from opscope.engine.testing.gguf_writer import hf_config, random_tensors, write_gguf

    cfg = hf_config(
        "llama", num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64, vocab_size=320
    )
    return str(write_gguf(tmp_path_factory.mktemp("fork") / "tiny.gguf", cfg, random_tensors(cfg, seed=3), types="F32"))


def _group(pgid: int) -> list[int]:
    pids = []
    for q in psutil.process_iter():
        try:
            if os.getpgid(q.pid) == pgid:
                pids.append(q.pid)
        except (ProcessLookupError, psutil.Error):
            pass
    return pids


def test_ctrl_c_at_the_fork_of_the_ranks_is_one_line_and_leaves_no_process(tmp_path, two_kv_heads_gguf):
    script = tmp_path / "ctrl_c_at_the_fork.py"
    script.write_text(CTRL_C_AT_THE_FORK)
    p = subprocess.Popen(
        [sys.executable, str(script), "generate", "hi", "-m", two_kv_heads_gguf, "-n", "4", "--nproc", "2"],
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        _, err = p.communicate(timeout=300)
        deadline = time.monotonic() + 30  # the forkserver and a rank leave once they see the launcher gone
        while (left := _group(p.pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        for pid in _group(p.pid):
            os.kill(pid, signal.SIGKILL)
    text = err.decode("utf-8", "replace")
    assert p.returncode == 130 and len(text.splitlines()) == 1, text
    assert text.startswith("opscope: interrupted"), text
    assert left == [], [psutil.Process(pid).cmdline() for pid in left if psutil.pid_exists(pid)]
