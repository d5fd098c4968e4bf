"""Ctrl-C in a one-process `opscope chat`: during a reply it stops that reply and the chat goes back
to its prompt; at the prompt it ends the chat with one line and exit 130 (Ctrl-D is the normal way
out, exit 0). The process is signalled at points read from its own output (a token on stdout, the
prompt written again), not after sleeps."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

# The embedded model's first 2 layers (the session's shared file: what is tested is the chat's
# signal handling, not the model; it loads in a fraction of the time) with the plain torch path (no
# kernel build), 8000 tokens: a reply that cannot end before its Ctrl-C.
CHAT = ("chat", "--fastpath", "off", "-n", "8000", "--ignore-eos")
MAIN = "import sys; from opscope.engine.cli.main import main; sys.exit(main())"


def _read_until(p: subprocess.Popen, done) -> bytes:
    seen = b""
    while not done(seen):
        chunk = os.read(p.stdout.fileno(), 4096)
        assert chunk, f"stdout ended after {seen!r}"
        seen += chunk
    return seen


def test_ctrl_c_stops_a_reply_then_ends_the_chat_at_its_prompt(tmp_path, default_model_2_layers):
    err = tmp_path / "err.txt"
    with open(err, "w") as f:
        p = subprocess.Popen(
            [sys.executable, "-c", MAIN, *CHAT, "--model", str(default_model_2_layers)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=f,
        )
    try:
        _read_until(p, lambda out: out.endswith(b"\n> "))  # the first prompt
        p.stdin.write(b"hello\n")
        p.stdin.flush()  # kept open: no EOF
        _read_until(p, lambda out: len(out) > 0)  # the reply streams
        p.send_signal(signal.SIGINT)
        _read_until(p, lambda out: out.endswith(b"\n> "))  # stopped: back at the prompt
        assert p.poll() is None
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=120) == 130
    finally:
        if p.poll() is None:
            p.kill()
    lines = err.read_text().splitlines()
    assert lines[-1] == "opscope: interrupted", lines
    assert lines.count("[stopped]") == 1 and sum(line.startswith("opscope:") for line in lines) == 1, lines
    assert not any("Traceback" in line for line in lines), lines


def test_end_of_input_at_the_prompt_is_a_normal_exit(default_model_2_layers):
    r = subprocess.run(
        [sys.executable, "-c", MAIN, *CHAT, "--model", str(default_model_2_layers)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert r.stderr.startswith("opscope chat · ") and "opscope:" not in r.stderr, r.stderr
