"""The `opscope` command: every capability of the workbench, headless.

User errors (EngineError) print one line and exit with the error's code (2); --debug shows the
traceback. Bad flags fail while parsing, in one line, before anything is loaded. Ctrl-C at any
moment (even while torch is still being imported) prints ``opscope: interrupted`` and exits 130;
SIGTERM prints ``opscope: terminated`` and exits 143, after the same clean-up (a run in progress is
closed as aborted in the store). The GUI is started by app.cli, which wraps this parser (the engine
never imports Qt). ``--debug`` and ``--db`` are accepted before or after the sub-command.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
from collections.abc import Callable

from opscope.engine.cli import output as cli_output
from opscope.engine.cli import signals as cli_signals
from opscope.engine.cli.args import CliParser, Terminated, non_empty, stderr_line, suppressed_copy
from opscope.engine.cli.output import DISK_FULL, StdoutError
from opscope.engine.core import progress
from opscope.engine.core.errors import Cancelled, EngineError

# Each module has register(subparsers); a module of an area not yet built is skipped.
COMMAND_MODULES = (
    "opscope.engine.cli.commands.generate",
    "opscope.engine.cli.commands.trace",
    "opscope.engine.cli.commands.diagnose",
    "opscope.engine.cli.commands.monitor",
    "opscope.engine.cli.commands.bench",
    "opscope.engine.cli.commands.runs",
    "opscope.engine.cli.commands.plugins",
    "opscope.engine.cli.commands.fastpath",
)
# Which module registers each command: `opscope generate …` imports only engine.commands.generate, so
# a bad flag fails in a fraction of a second instead of after importing torch for every command
# (engine.fastpath's package imports it). A command missing here still works: every module is then
# imported, as for `opscope --help`.
COMMAND_HOMES = {
    "generate": "opscope.engine.cli.commands.generate",
    "chat": "opscope.engine.cli.commands.generate",
    "models": "opscope.engine.cli.commands.generate",
    "trace": "opscope.engine.cli.commands.trace",
    "diagnose": "opscope.engine.cli.commands.diagnose",
    "monitor": "opscope.engine.cli.commands.monitor",
    "bench": "opscope.engine.cli.commands.bench",
    "runs": "opscope.engine.cli.commands.runs",
    "plugins": "opscope.engine.cli.commands.plugins",
    "fastpath": "opscope.engine.cli.commands.fastpath",
}
EXIT_SIGINT, EXIT_SIGTERM = 128 + signal.SIGINT, 128 + signal.SIGTERM


def install_signal_handlers() -> dict:
    """From the first line of main: Ctrl-C and SIGTERM become exceptions main turns into one line
    (engine.cli_signals). Returns the handlers they replace (main puts them back: tests call it
    in-process)."""
    return cli_signals.install()


def add_global_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    p.add_argument(
        "--db",
        default=None,
        metavar="URL",
        type=non_empty("a SQLAlchemy URL or a SQLite file path"),
        help="run store URL (SQLAlchemy) or SQLite file (default: SQLite in the user data dir)",
    )


def command_word(argv: list[str]) -> str | None:
    """The sub-command in ``argv``: the first word that is neither an option nor ``--db``'s value."""
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--db":
            skip = True
        elif arg == "--":
            return None
        elif not arg.startswith("-"):
            return arg
    return None


def _modules_for(argv: list[str] | None, gui: Callable | None) -> tuple[str, ...]:
    if argv is None:
        return COMMAND_MODULES
    word = command_word(argv)
    if gui is not None and (word == "gui" or (word is None and not {"-h", "--help"} & set(argv))):
        return ()  # the window: no engine command is parsed
    home = COMMAND_HOMES.get(word) if word is not None else None
    return (home,) if home in COMMAND_MODULES else COMMAND_MODULES


class _Parser(CliParser):
    """argparse drops a failed write of its help (``opscope --help > /dev/full`` exited 0): let it
    fail. Sub-command parsers are of the same class."""

    def _print_message(self, message: str, file=None) -> None:
        file = file or sys.stderr
        if message and file is not None:
            file.write(message)


def build_parser(gui: Callable | None = None, argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The `opscope` parser; given ``argv``, only the module of its command is imported (all without)."""
    p = _Parser(
        prog="opscope",
        description="Performance workbench for local transformer models.",
        global_flags=suppressed_copy(add_global_flags),
    )
    add_global_flags(p)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    if gui is not None:
        g = sub.add_parser("gui", help="open the desktop app (the default with no command)")
        g.add_argument("--model", "-m", default=None, help="GGUF file or HF directory (default: embedded model)")
        g.add_argument("--device", default=None, help="cpu, cuda, cuda:N")
        g.add_argument("--dtype", default=None, help="float32, bfloat16, float16")
        g.add_argument("--backend", default=None, help="backend plugin")
        g.add_argument("--theme", default=None, choices=("system", "light", "dark"))
        g.add_argument(
            "--screenshot",
            metavar="PATH",
            default=None,
            help="write a PNG of the window once the engine is idle, then exit",
        )
        g.set_defaults(func=gui)
    for name in _modules_for(argv, gui):
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
            continue
        module.register(sub)
    return p


def main(argv: list[str] | None = None, gui: Callable | None = None, whole_process: bool | None = None) -> int:
    """``whole_process`` (default: argv is None, the process's own command line): the process ends
    when this returns, so standard output is guarded (engine.cli_output); tests that call main
    in-process with their own argv keep their captured stdout."""
    whole_process = argv is None if whole_process is None else whole_process
    previous = install_signal_handlers()
    try:
        code = _main(argv, gui, whole_process)
    finally:
        cli_signals.restore(previous)
    if whole_process and code in (EXIT_SIGINT, EXIT_SIGTERM):
        # Every clean-up has run and the one line is out. A generation cut off mid-way, its tensors
        # left in a reference cycle, made torch abort in the teardown's collection (THPVariable_clear:
        # exit -6 after our line). Its generator is now closed where it is consumed
        # (commands/generate.py: _stream); the teardown is skipped all the same, so no other
        # half-done object can do it again.
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        os._exit(code)
    return code


def _main(argv: list[str] | None, gui: Callable | None, whole_process: bool) -> int:
    debug = "--debug" in (sys.argv[1:] if argv is None else argv)  # known before parsing: Ctrl-C may come then
    try:
        argv = sys.argv[1:] if argv is None else list(argv)
        if whole_process:  # the window (no engine command) may be a windowed launch, without stdout
            cli_output.guard(closed_is_error=_modules_for(argv, gui) != ())
        parser = build_parser(gui, argv)
        try:
            args = parser.parse_args(argv)
        except SystemExit as e:
            if e.code in (0, None):  # --help: what it printed must have reached stdout
                cli_output.flush()
            raise
        logging.basicConfig(
            level=logging.DEBUG if args.debug else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
        )
        progress.show_on_stderr()  # a first kernel build's minutes get a line, at any log level
        func = getattr(args, "func", None)
        if func is None:
            if gui is None:
                parser.print_help()
                cli_output.flush()
                return 0
            args.model = None
            func = gui
        if func is gui:  # Qt's event loop runs no Python for a signal handler: let SIGTERM end it
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        assert func is not None  # the command's handler, or the window
        return _run(func, args)
    except KeyboardInterrupt as e:
        return _interrupted(e, None, debug)
    except StdoutError as e:
        return cli_output.failed(e)
    except Exception as e:  # before a command runs (parsing, its module's import): only a wrapped signal
        if (signalled := _signal_under(e)) is None:
            raise
        return _interrupted(signalled, None, debug)


def _signal_under(e: BaseException) -> KeyboardInterrupt | None:
    """The Ctrl-C or SIGTERM (KeyboardInterrupt, Terminated) another exception was raised from or
    while handling: Python wraps one raised in a descriptor's __set_name__, as a dataclass's fields
    have while its class body is made at import, in RuntimeError("Error calling __set_name__ …")."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, KeyboardInterrupt):
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


def _interrupted(e: BaseException, cancelled: Cancelled | None, debug: bool) -> int:
    """One line for Ctrl-C or SIGTERM (a second one while this prints changes nothing)."""
    cli_signals.ignore_further()
    terminated = isinstance(e, Terminated) or isinstance(getattr(cancelled, "__cause__", None), Terminated)
    detail = f" ({cancelled})" if cancelled is not None else ""
    if debug:
        import traceback

        traceback.print_exception(cancelled or e)
    stderr_line(("terminated" if terminated else "interrupted") + detail)
    return EXIT_SIGTERM if terminated else EXIT_SIGINT


def _run(func: Callable, args) -> int:
    try:
        code = int(func(args) or 0)
        cli_output.flush()  # a full disk under a redirected stdout fails here, as one line, not at exit
        return code
    except KeyboardInterrupt as e:
        return _interrupted(e, None, args.debug)
    except StdoutError as e:  # before OSError: the command's output, not a file it writes
        if args.debug:
            import traceback

            traceback.print_exception(e)
        return cli_output.failed(e)
    except Cancelled as e:  # a long job stopped by Ctrl-C/SIGTERM: what it kept is in the message
        return _interrupted(e.__cause__ or e, e, args.debug)
    except EngineError as e:
        if args.debug:
            raise
        print(f"opscope: error: {e.for_cli()}", file=sys.stderr)
        return e.exit_code
    except OSError as e:
        if args.debug:
            raise
        full = e.errno in DISK_FULL
        hint = " — free some disk space and retry" if full else ""
        where = f": {e.filename}" if e.filename else ""
        print(f"opscope: error: {e.strerror or e}{where}{hint}", file=sys.stderr)
        return 2 if full else 1  # a full disk is the user's to fix, like any EngineError
    except Exception as e:  # a bug, not a user error: say so, keep the traceback behind --debug
        if (signalled := _signal_under(e)) is not None:
            return _interrupted(signalled, None, args.debug)
        if args.debug:
            raise
        print(
            f"opscope: internal error: {type(e).__name__}: {e} (rerun with --debug for the traceback)", file=sys.stderr
        )
        return 1


if __name__ == "__main__":
    sys.exit(main())
