"""Checked flag values for every `opscope` command, and the parser that reports a bad one in one line.

Each checker is an argparse ``type=``: it runs while the command line is parsed, before anything is
imported or loaded, and a bad value fails with the valid range in the message (exit 2), e.g.
``opscope: error: argument --threads: 100000 is out of range: use 1…2 (the logical CPUs here)``.
Other command modules build their flags from these (``int_in(1)``, ``float_in(0, finite=True)``, …).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from opscope.engine.core.errors import Terminated  # noqa: F401  (the commands catch it from here)
from opscope.engine.core.results import RUN_NAME_MAX_CHARS

SEED_MAX = 2**32 - 1  # what every backend and llama.cpp accept


def _fmt(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def _range_text(lo, hi, lo_open: bool = False, hi_open: bool = False) -> str:
    if hi is None:
        return f"{'>' if lo_open else '≥'} {_fmt(lo)}"
    if not lo_open and not hi_open:
        return f"{_fmt(lo)}…{_fmt(hi)}"
    return f"{'(' if lo_open else '['}{_fmt(lo)}, {_fmt(hi)}{')' if hi_open else ']'}"


def int_in(lo: int, hi: int | Callable[[], int] | None = None, what: str = "") -> Callable[[str], int]:
    """A whole number in lo…hi (hi may be a function, read when the flag is parsed)."""

    def parse(text: str) -> int:
        top = hi() if callable(hi) else hi
        rng = (_range_text(lo, top) if top is not None else f"a whole number ≥ {lo}") + (f" ({what})" if what else "")
        try:
            value = int(text.strip().replace("_", ""), 10)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number: use {rng}") from None
        if value < lo or (top is not None and value > top):
            raise argparse.ArgumentTypeError(f"{value} is out of range: use {rng}")
        return value

    parse.__name__ = "int"
    return parse


def float_in(
    lo: float | Callable[[], float],
    hi: float | Callable[[], float] | None = None,
    *,
    lo_open: bool = False,
    hi_open: bool = False,
    what: str = "",
) -> Callable[[str], float]:
    """A finite number in the given interval (open or closed at each end). A bound may be a function,
    read only when the flag is given (its module need not be imported to build the parser)."""

    def parse(text: str) -> float:
        low = lo() if callable(lo) else lo
        high = hi() if callable(hi) else hi
        rng = _range_text(low, high, lo_open, hi_open) + (f" ({what})" if what else "")
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number: use {rng}") from None
        low_bad = value <= low if lo_open else value < low
        high_bad = high is not None and (value >= high if hi_open else value > high)
        if not math.isfinite(value) or low_bad or high_bad:
            raise argparse.ArgumentTypeError(f"{text} is out of range: use a finite number {rng}")
        return value

    parse.__name__ = "float"
    return parse


def telemetry_interval_ms() -> Callable[[str], float]:
    """The sampler's interval range (engine.telemetry imports numpy: only when the flag is given)."""

    def bound(name: str) -> Callable[[], float]:
        def read() -> float:
            from opscope.engine.telemetry import sampler

            return getattr(sampler, name)

        return read

    return float_in(bound("MIN_INTERVAL_MS"), bound("MAX_INTERVAL_MS"))


def logical_cpus() -> int:
    return os.cpu_count() or 1


threads = int_in(1, logical_cpus, what="the logical CPUs here")
seed = int_in(0, SEED_MAX)
positive_int = int_in(1)
count = int_in(0)  # zero allowed: warm-ups, max events, …
max_tokens = int_in(1, 1_000_000)
top_k = int_in(0, 1_000_000, what="0 = off")  # beyond any vocabulary: the same as off
repeat = int_in(1, 1_000_000)
warmup = int_in(0, 1_000_000)
temperature = float_in(0.0, what="0 = greedy")
top_p = float_in(0.0, 1.0, lo_open=True)
min_p = float_in(0.0, 1.0, hi_open=True)
repetition_penalty = float_in(0.0, lo_open=True, what="1 = off")
positive_seconds = float_in(0.0, lo_open=True)
min_time_s = float_in(0.0, 86_400.0, what="seconds")
percent = float_in(0.0, what="percent")


def non_empty(what: str) -> Callable[[str], str]:
    """Text that must say something (a stop string, a store URL): UTF-8 and not blank."""

    def parse(text: str) -> str:
        text = utf8_text(text)
        if not text.strip():
            raise argparse.ArgumentTypeError(f"empty: give {what}")
        return text

    parse.__name__ = "text"
    return parse


def run_name(text: str) -> str:
    """A run's name as the store takes it (engine.store.runstore checks the same when saving):
    checked here so that a bad --name fails before a benchmark, not after it."""
    text = utf8_text(text)
    if text == "":
        return text  # the default: SUITE-DATE-TIME
    if text != text.strip() or len(text) > RUN_NAME_MAX_CHARS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a run name: use 1…{RUN_NAME_MAX_CHARS} characters, no leading or trailing spaces"
        )
    if text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is all digits and would read as a run id: add a letter")
    return text


run_name.__name__ = "name"


def tag(text: str) -> str:
    """A run's tag: some text, without leading or trailing spaces (engine.store.runstore checks the same)."""
    text = utf8_text(text)
    if not text.strip() or text != text.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not a tag: give some text without leading or trailing spaces")
    return text


def output_file(text: str) -> str:
    """A file the command will write: not a folder, in a folder that exists (checked before the
    work whose result it receives, not after)."""
    path = Path(text).expanduser()
    if not text.strip():
        raise argparse.ArgumentTypeError("empty: give a file name")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder: give a file name, e.g. {path / 'out'}")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: its folder {path.parent} does not exist: create it first")
    return text


output_file.__name__ = "file"


def output_path(text: str) -> Path:
    """output_file, as a Path."""
    return Path(output_file(text))


output_path.__name__ = "file"


def utf8_text(text: str) -> str:
    """Text from argv: bytes that are not UTF-8 arrive as surrogate escapes; name the first."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raw = text[e.start].encode("utf-8", "surrogateescape")
        raise argparse.ArgumentTypeError(
            f"not valid UTF-8 text (byte 0x{raw[0]:02x} at character {e.start}): pass the text in UTF-8"
        ) from None
    return text


utf8_text.__name__ = "text"


# --- the parser --------------------------------------------------------------------------------

_QUOTED_CHOICE = re.compile(r"'([^']*)'")


def one_line(message: str) -> str:
    """argparse's message in one line, choices listed without quotes."""
    message = " ".join(message.split())
    head, sep, choices = message.partition("(choose from ")
    if sep:
        message = head + sep + _QUOTED_CHOICE.sub(r"\1", choices)
    return message


class CliParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (``opscope: error: …``, exit 2) instead of the
    usage block, and whose sub-commands (``add_subparsers``) all accept the global flags."""

    def __init__(self, *args, global_flags: argparse.ArgumentParser | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._global_flags = global_flags
        self.register("action", "parsers", _SubParsers)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"opscope: error: {one_line(message)}\n")

    def add_subparsers(self, **kwargs):
        action = super().add_subparsers(**kwargs)
        assert isinstance(action, _SubParsers)  # registered as the "parsers" action above
        action.global_flags = self._global_flags
        return action


class _SubParsers(argparse._SubParsersAction):
    """Every sub-command parser inherits the global flags (defaults suppressed, so a flag given
    before the sub-command is kept unless repeated after it) and the one-line errors."""

    global_flags: argparse.ArgumentParser | None = None

    def add_parser(self, name, **kwargs):
        if self.global_flags is not None:
            kwargs["parents"] = [*kwargs.get("parents", ()), self.global_flags]
            kwargs.setdefault("global_flags", self.global_flags)
        return super().add_parser(name, **kwargs)


def suppressed_copy(add_flags: Callable[[argparse.ArgumentParser], None]) -> argparse.ArgumentParser:
    """A parent parser holding the flags ``add_flags`` defines, with their defaults suppressed."""
    parent = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    add_flags(parent)
    for action in parent._actions:
        action.default = argparse.SUPPRESS
    return parent


def stderr_line(text: str) -> None:
    print(f"opscope: {text}", file=sys.stderr, flush=True)
