"""Ctrl-C and SIGTERM from the first line of `opscope` on: one line, exit 130 / 143, never a traceback.

Real processes through the installed `opscope` script (`models inspect` and `generate` on the
embedded model), each signalled at a delay counted from the moment its own code starts: the first
thing app.cli's main does is catch SIGTERM, which Python leaves alone, so the SigCgt mask in
/proc/PID/status shows that instant from outside, without any hook. The delays (0 to 1.5 s) land in
the imports of the command modules, of torch, in the model's load and in generation. A process that
finished before its signal must have exited 0 with nothing on stderr.

What comes before that instant is the interpreter's own start, where no opscope code has run (the
handlers go in at main's first line, through the already loaded _signal module; `opscope.app.cli`'s
import takes under a millisecond). A Ctrl-C there is Python's affair, as for any Python program:
before Python's own handler is in place the process dies by SIGINT silently (the shell shows 130);
during the import of site (and of the .pth files: setuptools' distutils-precedence.pth, in a
development venv the editable-install finder) Python prints "Fatal Python error: init_import_site:
Failed to import the site module" and a traceback and exits 1, or, inside a .pth line, "Error
processing line 1 of ….pth … Remainder of file ignored" and starts anyway (the Ctrl-C is lost); in
the console script's own `import re` / `from opscope.app.cli import main`, a KeyboardInterrupt
traceback and death by SIGINT (130). SIGTERM there ends the process silently (143).

The processes run side by side (threads), so the whole module takes about as long as its longest
delay plus one start-up.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

OPSCOPE = str(Path(sys.executable).parent / "opscope")
LINE = {signal.SIGINT: "opscope: interrupted\n", signal.SIGTERM: "opscope: terminated\n"}
INSPECT = ("models", "inspect")
GENERATE = ("generate", "Once upon a time", "--max-tokens", "8000", "--ignore-eos")

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc/PID/status")


EARLY_RSS_KB = 60_000  # the bare interpreter is ~11 MB; importing torch alone adds ~200 MB


def _catches(pid: int, sig: int) -> int | None:
    """The process's RSS (kB) once it catches ``sig``, else None."""
    try:
        status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return None
    if int(status["SigCgt"].strip(), 16) >> (sig - 1) & 1:
        return int(status["VmRSS"].split()[0])
    return None


def _signalled(args: tuple[str, ...], sig: int, delay_s: float) -> dict:
    p = subprocess.Popen([OPSCOPE, *args], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while (rss_kb := _catches(p.pid, signal.SIGTERM)) is None and p.poll() is None:
        assert time.monotonic() < deadline, "opscope never reached its own code"
        time.sleep(0.001)
    time.sleep(delay_s)
    finished_before = p.poll() is not None
    if not finished_before:
        p.send_signal(sig)
    _, err = p.communicate(timeout=120)
    return {
        "args": args,
        "signal": sig.name,
        "delay_s": delay_s,
        "rc": p.returncode,
        "rss_kb": rss_kb,
        "stderr": err.decode("utf-8", "replace"),
        "finished_before": finished_before,
    }


def _run_all(cases: list[tuple[tuple[str, ...], int, float]]) -> list[dict]:
    results: list[dict | None] = [None] * len(cases)

    def one(i: int) -> None:
        results[i] = _signalled(*cases[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(cases))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # the handlers go in before anything heavy is imported (the window they leave is the
    # interpreter's own start); on a busy machine a poll may come late, so the earliest one counts
    seen = [r["rss_kb"] for r in results if r["rss_kb"] is not None]
    assert seen and min(seen) < EARLY_RSS_KB, f"signals caught only at {seen} kB of RSS"
    return results


def _check(r: dict) -> None:
    sig = getattr(signal, r["signal"])
    clean_exit = (r["rc"], r["stderr"]) == (0, "")
    one_line = (r["rc"], r["stderr"]) == (128 + sig, LINE[sig])
    said = f"{r['args'][0]} at {r['delay_s']} s: rc {r['rc']}, stderr {r['stderr']!r}"  # what a failure prints
    assert "Traceback" not in r["stderr"], said
    # a process may finish between the check and the signal (inspect takes about a second)
    assert one_line or clean_exit, said
    if r["finished_before"]:
        assert clean_exit, said


DELAYS = (0.0, 0.01, 0.05, 0.15, 0.4, 0.8, 1.5)


def test_sigint_at_any_moment_is_one_line_and_130():
    cases = [(INSPECT, signal.SIGINT, d) for d in DELAYS] + [(GENERATE, signal.SIGINT, d) for d in DELAYS]
    results = _run_all(cases)
    for r in results:
        _check(r)
    # the generation cannot have finished (8000 tokens): every one of them was interrupted
    assert all(r["rc"] == 130 for r in results if r["args"] == GENERATE), results


# Statistical (under load, about one round in 13 lost its SIGTERM before the fix: see the next test for
# the cause, which it checks deterministically in the normal suite) and costly (4 generations on 2
# cores), so it stays behind the stress marker: make stress-check.
@pytest.mark.stress
def test_sigterm_at_any_moment_is_one_line_and_143():
    results = _run_all([(GENERATE, signal.SIGTERM, d) for d in (0.0, 0.05, 0.4, 1.5)])
    for r in results:
        _check(r)
        assert r["rc"] == 143, r


# The cause of the lost SIGTERM above: torch._C's module init imports numpy and, when that import
# raises, clears the error and goes on without numpy ("Failed to initialize NumPy"); a signal whose
# exception was raised there vanished, and the generation ran on. A meta-path hook sends the signal
# at exactly that moment (the first import of numpy, which torch._C's init makes), deterministically.
SIGNAL_IN_TORCH_INIT = """
import os, signal, sys
from pathlib import Path

class SignalOnNumpy:
    def find_spec(self, name, path=None, target=None):
        if name == "numpy":
            sys.meta_path.remove(self)
            frames, f = [], sys._getframe()
            while f is not None:
                frames.append(type(f.f_locals.get("self")).__name__)
                f = f.f_back
            Path(os.environ["SEEN"]).write_text(str("ExtensionFileLoader" in frames))
            os.kill(os.getpid(), int(os.environ["SIGNAL"]))
        return None

sys.meta_path.insert(0, SignalOnNumpy())
from opscope.app.cli import main
sys.exit(main())
"""


def _generate_through(script: Path, source: str, sig: int, **env: str) -> subprocess.CompletedProcess:
    """A one-token generate (plain torch) run by ``source``, which calls opscope's main after setting
    up when to send ``sig`` (environment SIGNAL)."""
    script.write_text(source)
    return subprocess.run(
        [sys.executable, str(script), *GENERATE[:2], "--max-tokens", "1", "--fastpath", "off"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env, "SIGNAL": str(int(sig))},
        timeout=300,
    )


@pytest.mark.parametrize("sig", [signal.SIGTERM])
def test_a_signal_inside_torch_s_extension_init_is_not_lost(tmp_path, sig):
    seen = tmp_path / "seen"
    r = _generate_through(tmp_path / "signal_in_torch_init.py", SIGNAL_IN_TORCH_INIT, sig, SEEN=str(seen))
    assert seen.read_text() == "True", "numpy was not first imported by an extension's init"
    assert (r.returncode, r.stderr) == (128 + sig, LINE[sig]), r.stderr


# Python swallows an exception raised where it cannot propagate (a weakref callback, as the import
# system's module-lock `cb`; a __del__) and reports it to sys.unraisablehook: a SIGTERM handled there
# was lost too (found by the stress test after the fix above). A weakref callback that receives the
# signal: the process must still end with Terminated, not run on.
SIGNAL_IN_WEAKREF_CALLBACK = """
import os, signal, time, weakref
from opscope.engine.cli import signals as cli_signals
from opscope.engine.cli.args import Terminated

cli_signals.install()
class Thing:
    pass
def callback(_ref):
    os.kill(os.getpid(), signal.SIGTERM)
    sum(range(100_000))  # the handler runs here, inside the callback
thing = Thing()
ref = weakref.ref(thing, callback)
try:
    del thing
    time.sleep(5)
    print("lost")
except Terminated:
    print("raised")
"""


def test_a_signal_inside_a_weakref_callback_is_not_lost():
    r = subprocess.run([sys.executable, "-c", SIGNAL_IN_WEAKREF_CALLBACK], capture_output=True, text=True, timeout=60)
    assert (r.stdout, r.stderr) == ("raised\n", ""), r


# Python 3.11 turns an exception raised in a descriptor's __set_name__ (while a class body is made,
# e.g. a dataclass's fields, in an import) into RuntimeError("Error calling __set_name__ …") from it:
# a Ctrl-C landing there came out as "internal error" and exit 1 (seen in CI: generate at 0.4 s). The
# same moment, made deterministic by a meta-path hook at the import of the module that defines the
# engine's Marker dataclass (outside torch's import, where signals are held: decision 0002).
SIGNAL_IN_SET_NAME = """
import os, signal, sys

class SignalInSetName:
    def find_spec(self, name, path=None, target=None):
        if name == "opscope.engine.core.markers":
            sys.meta_path.remove(self)

            class Field:
                def __set_name__(self, owner, attr):
                    os.kill(os.getpid(), int(os.environ["SIGNAL"]))
                    sum(range(100_000))  # the handler runs here, inside __set_name__

            class Marker:
                attrs = Field()
        return None

sys.meta_path.insert(0, SignalInSetName())
from opscope.app.cli import main
sys.exit(main())
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_inside_set_name_is_an_interrupt_not_an_internal_error(tmp_path, sig):
    r = _generate_through(tmp_path / "signal_in_set_name.py", SIGNAL_IN_SET_NAME, sig)
    assert (r.returncode, r.stderr) == (128 + sig, LINE[sig]), r.stderr
