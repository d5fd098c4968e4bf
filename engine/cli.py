"""The `opscope` command: every capability of the workbench, headless.

User errors (EngineError) print one line and exit with the error's code (2); --debug shows the
traceback. The GUI is started by app.cli, which wraps this parser (the engine never imports Qt).
"""
from __future__ import annotations

import argparse
import errno
import importlib
import logging
import sys
from typing import Callable

from engine.errors import EngineError

# Each module has register(subparsers); a module of an area not yet built is skipped.
COMMAND_MODULES = (
    "engine.commands.generate",
    "engine.trace.commands",
    "engine.telemetry.commands",
    "engine.bench.commands",
    "engine.store.commands",
    "engine.backends.commands",
    "engine.fastpath.commands",
)


def build_parser(gui: Callable | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="opscope", description="Performance workbench for local transformer models.")
    p.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    p.add_argument("--db", default=None, help="run store URL (SQLAlchemy; default: SQLite in the user data dir)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    if gui is not None:
        g = sub.add_parser("gui", help="open the desktop app (the default with no command)")
        g.add_argument("--model", "-m", default=None, help="GGUF file or HF directory (default: embedded model)")
        g.add_argument("--device", default=None, help="cpu, cuda, cuda:N")
        g.add_argument("--dtype", default=None, help="float32, bfloat16, float16")
        g.add_argument("--backend", default=None, help="backend plugin")
        g.add_argument("--theme", default=None, choices=("system", "light", "dark"))
        g.add_argument("--screenshot", metavar="PATH", default=None,
                       help="write a PNG of the window once the engine is idle, then exit")
        g.set_defaults(func=gui)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
            continue
        module.register(sub)
    return p


def main(argv: list[str] | None = None, gui: Callable | None = None) -> int:
    parser = build_parser(gui)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.debug else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    func = getattr(args, "func", None)
    if func is None:
        if gui is None:
            parser.print_help()
            return 0
        args.model = None
        func = gui
    return _run(func, args)


def _run(func: Callable, args) -> int:
    try:
        return int(func(args) or 0)
    except EngineError as e:
        if args.debug:
            raise
        print(f"opscope: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("opscope: interrupted", file=sys.stderr)
        return 130
    except OSError as e:
        if args.debug:
            raise
        hint = " — free some disk space and retry" if e.errno in (errno.ENOSPC, errno.EDQUOT) else ""
        where = f": {e.filename}" if e.filename else ""
        print(f"opscope: error: {e.strerror or e}{where}{hint}", file=sys.stderr)
        return 1
    except Exception as e:  # a bug, not a user error: say so, keep the traceback behind --debug
        if args.debug:
            raise
        print(f"opscope: internal error: {type(e).__name__}: {e} (rerun with --debug for the traceback)",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
