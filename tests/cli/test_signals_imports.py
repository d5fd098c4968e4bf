"""SIGINT/SIGTERM while torch is being imported wait for the import's end (engine.cli_signals.held).

torch's import calls back into Python from C++ (torch._C._initExtension imports torch.cuda, among
others): an exception raised by a signal handler there ran through C++ frames, left torch half
imported, and in a loop that SIGTERMed `opscope generate` in its first seconds now and then aborted
the process (exit -6). Since then the import of torch (and numpy) runs with SIGINT/SIGTERM blocked,
and the signal is raised a few milliseconds after the import has returned.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from opscope.engine.cli import signals as cli_signals
from opscope.engine.cli.args import Terminated

# A meta-path hook sends SIGTERM at the moment torch's C++ init (_C._initExtension) imports torch.cuda:
# the handler runs inside C++ frames. The signal must neither be lost nor cut the import short.
SIGNAL_INSIDE_TORCH_S_IMPORT = """
import os, signal, sys, time
from opscope.engine.cli import signals as cli_signals
from opscope.engine.cli.args import Terminated

class SignalInsideTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch.cuda":
            sys.meta_path.remove(self)
            f = sys._getframe(1)
            while f.f_code.co_filename.startswith("<frozen"):
                f = f.f_back
            print("sent from", f.f_code.co_filename.rsplit("site-packages", 1)[-1])
            os.kill(os.getpid(), signal.SIGTERM)
        return None

cli_signals.install()
sys.meta_path.insert(0, SignalInsideTorch())
try:
    import torch
    time.sleep(10)
    print("lost")
except Terminated:
    torch = sys.modules.get("torch")
    print("loader:", type(getattr(torch, "__loader__", None)).__name__)
    print("raised after the import:", torch is not None and callable(getattr(torch, "compile", None)))
"""


def test_a_signal_inside_torch_s_import_is_raised_once_the_import_has_returned():
    r = subprocess.run(
        [sys.executable, "-c", SIGNAL_INSIDE_TORCH_S_IMPORT], capture_output=True, text=True, timeout=300
    )
    assert r.stderr == "" and r.stdout.endswith("raised after the import: True\n"), (r.stdout, r.stderr)
    assert r.stdout.startswith("sent from /torch/__init__.py"), r.stdout  # inside torch's own import
    assert "loader: SourceFileLoader\n" in r.stdout  # the hook's wrapper is gone once torch runs


@pytest.mark.parametrize("sig, exc", [(signal.SIGINT, KeyboardInterrupt), (signal.SIGTERM, Terminated)])
def test_held_raises_the_signal_after_the_block_not_inside_it(sig, exc):
    previous = cli_signals.install()
    reached_the_end = False
    try:
        with pytest.raises(exc):
            with cli_signals.held():
                os.kill(os.getpid(), sig)
                time.sleep(0.05)  # a handler that ran here would raise out of the block now
                reached_the_end = True
            time.sleep(5)  # raised by the retry timer within a few ms
    finally:
        cli_signals.restore(previous)
    assert reached_the_end


def test_the_import_hook_is_first_while_installed_and_gone_after():
    previous = cli_signals.install()
    try:
        assert sys.meta_path[0] is cli_signals._finder
    finally:
        cli_signals.restore(previous)
    assert cli_signals._finder not in sys.meta_path
