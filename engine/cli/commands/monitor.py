"""``opscope monitor``: a live table of every available telemetry source, like ``nvidia-smi dmon``.

On a machine without an NVIDIA GPU it says so once (with NVML's reason) and shows the host.
"""

from __future__ import annotations

import argparse
import math
import queue
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from opscope.engine.cli.args import stderr_line
from opscope.engine.core import json_output
from opscope.engine.core.clock import now_ns
from opscope.engine.core.errors import ConfigError

if TYPE_CHECKING:
    from rich.live import Live

MONITOR_HISTORY_S = 60.0  # the monitor shows the latest values only; keep its ring small


def register(subparsers: argparse._SubParsersAction) -> None:
    from opscope.engine.cli import args as check

    p = subparsers.add_parser(
        "monitor",
        help="live GPU/host telemetry table (like nvidia-smi dmon)",
        description="Show GPU (NVML, amdsmi) and host (CPU, RAM, a process) telemetry live. Ctrl-C stops.",
    )
    p.add_argument(
        "--interval",
        type=check.telemetry_interval_ms(),
        default=1000.0,
        metavar="MS",
        help="sampling interval in ms, 20..60000 (default 1000)",
    )
    p.add_argument(
        "--duration",
        type=check.positive_seconds,
        default=None,
        metavar="S",
        help="stop after S seconds (default: run until Ctrl-C)",
    )
    p.add_argument("--csv", type=Path, default=None, metavar="FILE", help="also write every sample to FILE as CSV")
    p.add_argument(
        "--json", action="store_true", help="print one JSON object per sample (JSON Lines) instead of the table"
    )
    p.add_argument(
        "--pid",
        type=check.positive_int,
        default=None,
        help="process whose RSS, CPU %% and GPU memory to show (default: the monitor)",
    )
    p.add_argument(
        "--no-pcie", action="store_true", help="skip NVML PCIe throughput (each read blocks ~20 ms in the driver)"
    )
    p.set_defaults(func=cmd_monitor)


def cmd_monitor(args: argparse.Namespace) -> int:
    from opscope.engine.telemetry.export import CsvSink
    from opscope.engine.telemetry.sampler import Sampler
    from opscope.engine.telemetry.sources import default_sources

    if args.duration is not None and not args.duration > 0:
        raise ConfigError(f"--duration must be > 0 seconds, got {args.duration}")
    watched = _watched_process(args.pid)  # before sampling: a wrong pid would show empty columns forever
    sources = default_sources(pid=args.pid, in_process=False, pcie=not args.no_pcie)
    sampler = Sampler(sources, interval_ms=args.interval, history_s=MONITOR_HISTORY_S)
    snapshots: queue.Queue = queue.Queue()
    sampler.subscribe(snapshots.put)
    sink = None
    try:
        sampler.start()
        out = _Output(args.json, sampler)
        out.notes(sampler.sources)
        sink = CsvSink(args.csv, sampler.units) if args.csv else None
        if not _loop(sampler, snapshots, out, sink, args.duration, watched):
            stderr_line(f"process {args.pid} exited; monitor stopped")
    except KeyboardInterrupt as e:  # Ctrl-C is how the monitor stops; SIGTERM still ends with 143
        from opscope.engine.cli.args import Terminated

        if isinstance(e, Terminated):
            raise
    except BrokenPipeError:  # `opscope monitor | head`: the reader left; not an error
        _silence_stdout()
    finally:
        sampler.stop()
        if sink is not None:
            sink.close()
    return 0


def _watched_process(pid: int | None):
    """The --pid process (psutil.Process), or None without --pid; a pid with no live process is a
    ConfigError."""
    if pid is None:
        return None
    try:
        import psutil
    except ImportError:  # HostSource says psutil is missing; nothing to watch
        return None
    try:
        proc = psutil.Process(pid)
    except psutil.NoSuchProcess:
        proc = None
    if proc is None or not _alive(proc):
        raise ConfigError(f"--pid {pid}: no such process: give the id of a running process (see ps)")
    return proc


def _alive(proc) -> bool:
    """Whether the watched process still runs: an exited child its parent has not reaped yet is a
    zombie, which psutil still finds."""
    import psutil

    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:  # e.g. AccessDenied: it exists
        return True


def _loop(sampler, snapshots: queue.Queue, out: _Output, sink, duration_s: float | None, watched=None) -> bool:
    """Show samples until the duration is over (or Ctrl-C); False when the watched process exited."""
    deadline = None if duration_s is None else now_ns() + int(duration_s * 1e9)
    with out:
        while deadline is None or now_ns() < deadline:
            if watched is not None and not _alive(watched):
                return False
            wait_s = 1.0 if deadline is None else max(0.0, min(1.0, (deadline - now_ns()) / 1e9))
            try:
                snap = snapshots.get(timeout=wait_s)
            except queue.Empty:
                continue
            if sink is not None:
                sink.write(snap.t_ns, dict(snap.values))
            out.show(snap)
            out.status_changes(sampler.status())
    return True


class _Output:
    """Where samples go: JSON Lines, plain dmon-style lines (piped) or a live rich table."""

    def __init__(self, as_json: bool, sampler) -> None:
        from opscope.engine.telemetry.view import MonitorView
        from rich.console import Console

        self.as_json = as_json
        self.console = Console(highlight=False)  # only for the live table on a terminal
        self.notes_to = sys.stderr if as_json else sys.stdout  # keep JSON Lines pure
        self.view = MonitorView(sampler.series_names())
        self.t0_ns = sampler.start_ns
        self.live: Live | None = None
        self.last_status = sampler.status()

    def notes(self, sources) -> None:
        for s in sources:
            if not s.available and not s.missing_package:
                print(s.reason, file=self.notes_to, flush=True)

    def status_changes(self, status: dict[str, str]) -> None:
        for name, text in status.items():
            if text != self.last_status.get(name):
                print(f"{name}: {text}", file=self.notes_to, flush=True)
        self.last_status = status

    def __enter__(self) -> _Output:
        if not self.as_json and self.console.is_terminal:
            from rich.live import Live

            self.live = Live(console=self.console, auto_refresh=False).__enter__()
        elif not self.as_json:
            _write(self.view.header_lines())
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)

    def show(self, snap) -> None:
        if self.as_json:
            values = {k: (None if math.isnan(v) else v) for k, v in snap.values.items()}
            sys.stdout.write(json_output.dumps({"t_ns": snap.t_ns, "tick": snap.tick, "values": values}) + "\n")
            sys.stdout.flush()
        elif self.live is not None:
            from rich.console import Group
            from rich.text import Text

            caption = Text(f"t {(snap.t_ns - self.t0_ns) / 1e9:.1f} s  (Ctrl-C stops)", style="dim")
            self.live.update(Group(caption, *self.view.tables(snap.values)), refresh=True)
        else:
            _write(self.view.lines((snap.t_ns - self.t0_ns) / 1e9, snap.values))


def _silence_stdout() -> None:
    # Python would report the broken pipe again when it flushes stdout at exit.
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def _write(lines: list[str]) -> None:
    sys.stdout.write("".join(line + "\n" for line in lines))
    sys.stdout.flush()
