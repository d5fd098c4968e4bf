"""Chat templates from model files, rendered in jinja2's immutable sandbox with limits on work and size.

The sandbox stops a template from reaching Python internals, but not from working forever or
building a gigabyte string: ``{{ 'A' * 10**9 }}``, nested loops over ``range(99999)``, a macro that
calls itself twice per level. Here every loop item, call, attribute lookup and intercepted operator
is charged to an operation budget (with a wall-clock deadline checked as it is charged), every
string-growing operation (``*``, ``+``, ``~``, ``%``, ``center``, ``format``, ``replace``, ``join``,
…) is refused before it would exceed the size cap, and the output is capped as it streams. Every
failure is a ChatTemplateError (UnsafeTemplate for a limit) naming the file and the template key.

    ChatTemplate(text, path, "tokenizer.chat_template").render(messages=[...], add_generation_prompt=True)
"""

from __future__ import annotations

import contextvars
import json
import re
import time
from collections.abc import Callable
from datetime import datetime
from functools import cached_property
from os import PathLike
from typing import Any, NoReturn

from opscope.engine.core.errors import ChatTemplateError, ModelLoadError, UnsafeTemplate

MAX_TEMPLATE_CHARS = 256 * 1024
MAX_CHARS = 1 << 20  # any one string the template builds, and the output, beyond the messages' own size
MADE_FACTOR = 16  # all strings and lists the template builds, in all: 16 × the one-string cap
MAX_OPS = 1_000_000
MAX_SECONDS = 5.0
MAX_RANGE = 100_000
MAX_INT_BITS = 1 << 16
_WIDTH = re.compile(r"\d{7,}|[1-9]\d*")


class _Limit(Exception):
    """A limit was hit (raised inside the template, turned into UnsafeTemplate by render)."""


class _Budget:
    def __init__(self, max_chars: int):
        self.ops, self.max_chars, self.total = 0, max_chars, 0
        self.deadline = time.monotonic() + MAX_SECONDS

    def charge(self, n: int = 1) -> None:
        self.ops += n
        if self.ops > MAX_OPS:
            raise _Limit(f"it ran more than {MAX_OPS} operations")
        if self.ops & 1023 == 0 and time.monotonic() > self.deadline:
            raise _Limit(f"it ran longer than {MAX_SECONDS:g} s")

    def size(self, n: int, what: str) -> None:
        if n > self.max_chars:
            raise _Limit(f"{what} would make a string or list of {n} items, over the cap of {self.max_chars}")

    def made(self, n: int, what: str) -> None:
        """``n`` more items built: many strings each under the cap must not add up to gigabytes."""
        self.size(n, what)
        self.total += n
        if self.total > MADE_FACTOR * self.max_chars:
            raise _Limit(f"it built more than {MADE_FACTOR * self.max_chars} characters in all")


_BUDGET: contextvars.ContextVar[_Budget] = contextvars.ContextVar("chat_template_budget")


def _budget() -> _Budget:
    return _BUDGET.get()


def _length(x: object) -> int:
    return len(x) if isinstance(x, (str, bytes, list, tuple, dict)) else 0


def _check_widths(fmt: str, what: str) -> None:
    """Field widths and precisions in a %- or {}-format string (``%0999999999d``) are output sizes."""
    for m in _WIDTH.finditer(fmt):
        _budget().size(int(m.group()), what)


def _env() -> Any:  # a jinja2 sandboxed Environment (jinja2 is read as untyped)
    from jinja2 import nodes, pass_context
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from jinja2.visitor import NodeTransformer

    class _Charged(NodeTransformer):
        """Every for loop's iterable passes through the ``_each`` filter (charged per item); every
        ``~`` through ``_concat`` (size-checked)."""

        def visit_For(self, node: Any) -> Any:
            node = self.generic_visit(node)
            node.iter = nodes.Filter(node.iter, "_each", [], [], None, None).set_lineno(node.lineno)
            return node

        def visit_Concat(self, node: Any) -> Any:
            node = self.generic_visit(node)
            items = nodes.List(node.nodes).set_lineno(node.lineno)
            return nodes.Filter(items, "_concat", [], [], None, None).set_lineno(node.lineno)

    class Env(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset(["*", "**", "+", "%", "//"])

        def _parse(self, source: str, name: str | None, filename: str | None) -> Any:
            return _Charged().visit(super()._parse(source, name, filename))

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            _budget().charge()
            _check_binop(operator, left, right)
            result = super().call_binop(context, operator, left, right)
            _budget().made(_length(result), f"'{operator}'")
            return result

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
            _budget().charge()
            args = _check_method(__obj, args)
            result = super().call(__context, __obj, *args, **kwargs)
            _budget().made(_length(result), "a call")
            return result

        def getattr(self, obj: Any, attribute: str) -> Any:
            _budget().charge()
            return super().getattr(obj, attribute)

        def getitem(self, obj: Any, argument: Any) -> Any:
            _budget().charge()
            return super().getitem(obj, argument)

    @pass_context
    def each(_ctx: Any, iterable: Any) -> Any:
        if isinstance(iterable, (str, list, tuple, dict, range)):
            _budget().charge(len(iterable) + 1)
            return iterable
        return (_charged(x) for x in iterable)

    @pass_context
    def concat(_ctx: Any, parts: Any) -> str:
        texts = [str(p) for p in parts]
        _budget().made(sum(map(len, texts)), "'~'")
        return "".join(texts)

    env = Env(trim_blocks=True, lstrip_blocks=True)
    env.globals.pop("lipsum", None)
    env.globals.update(range=_range, raise_exception=_raise, strftime_now=lambda fmt: datetime.now().strftime(fmt))
    env.filters.update(_each=each, _concat=concat, tojson=_tojson)
    for name in ("center", "indent", "format", "replace", "join", "wordwrap", "slice", "batch", "truncate"):
        env.filters[name] = _capped_filter(env.filters[name], name)
    return env


def _charged(x: Any) -> Any:
    _budget().charge()
    return x


def _range(*args: int) -> range:
    r = range(*args)
    if len(r) > MAX_RANGE:
        raise _Limit(f"range() of {len(r)} items is over the cap of {MAX_RANGE}")
    _budget().charge(len(r))
    return r


def _raise(message: str) -> NoReturn:
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)


def _tojson(x: Any, indent: int | None = None, **_: Any) -> str:
    if indent is not None:
        _budget().size(int(indent) * 64, "tojson's indent")
    out = json.dumps(x, ensure_ascii=False, indent=indent)
    _budget().made(len(out), "tojson")
    return out


def _check_binop(op: str, left: Any, right: Any) -> None:
    b = _budget()
    if op == "*" and isinstance(right, int) and _length(left):
        b.size(_length(left) * right, "'*'")
    elif op == "*" and isinstance(left, int) and _length(right):
        b.size(_length(right) * left, "'*'")
    elif op == "*" and isinstance(left, int) and isinstance(right, int):
        if left.bit_length() + right.bit_length() > MAX_INT_BITS:
            raise _Limit(f"'*' on integers of {left.bit_length()} and {right.bit_length()} bits")
    elif op == "**" and isinstance(left, (int, float)) and isinstance(right, (int, float)):
        if abs(left) > 1 and abs(right) * int(max(abs(left), 2)).bit_length() > MAX_INT_BITS:
            raise _Limit(f"'**' with exponent {right}")
    elif op == "+" and _length(left) and _length(right):
        b.size(_length(left) + _length(right), "'+'")
    elif op == "%" and isinstance(left, str):
        _check_widths(left, "'%' formatting")


_STR_WIDTH_METHODS = {"center", "ljust", "rjust", "zfill"}


def _check_method(obj: Any, args: tuple) -> tuple:
    """str methods whose output size comes from their arguments, checked before they run; the
    arguments to call it with (an iterable given to join is read into a list first)."""
    owner, name = getattr(obj, "__self__", None), getattr(obj, "__name__", "")
    if not isinstance(owner, str):
        return args
    b = _budget()
    if name in _STR_WIDTH_METHODS and args and isinstance(args[0], int):
        b.size(args[0], f"str.{name}")
    elif name == "expandtabs":
        b.size(len(owner) + owner.count("\t") * (int(args[0]) if args else 8), "str.expandtabs")
    elif name in ("format", "format_map"):
        _check_widths(owner, "str.format")
    elif name == "replace" and len(args) >= 2:
        old, new = str(args[0]), str(args[1])
        b.size(len(owner) + (len(owner) // max(len(old), 1) + 1) * len(new), "str.replace")
    elif name == "join" and args:
        items = list(map(_charged, args[0]))
        b.size(sum(_length(x) for x in items) + len(owner) * len(items), "str.join")
        args = (items, *args[1:])
    return args


def _capped_filter(original: Callable[..., Any], name: str) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        b = _budget()
        b.charge()
        value = (
            args[1 if getattr(original, "jinja_pass_arg", None) else 0]
            if len(args) > 1
            else (args[0] if args else None)
        )
        rest = [a for a in args if isinstance(a, int) and not isinstance(a, bool)] + [
            v for v in kwargs.values() if isinstance(v, int) and not isinstance(v, bool)
        ]
        if name in ("center", "indent", "slice", "batch", "wordwrap", "truncate"):
            for n in rest:
                b.size(n * max(1, str(value).count("\n") + 1 if name == "indent" else 1), f"the {name} filter")
        elif name == "format" and isinstance(value, str):
            _check_widths(value, "the format filter")
        elif name == "replace" and isinstance(value, str):
            strs = [a for a in args if isinstance(a, str)]
            new = strs[-1] if len(strs) >= 3 else ""
            b.size(len(value) + (len(value) + 1) * len(new), "the replace filter")
        elif name == "join" and value is not None and not isinstance(value, (str, dict)):
            items = list(map(_charged, value))
            b.size(sum(_length(x) + 8 for x in items), "the join filter")
            args = tuple(items if a is value else a for a in args)
        result = original(*args, **kwargs)
        b.made(_length(result), f"the {name} filter")
        return result

    for attr in ("jinja_pass_arg",):  # keep jinja's pass_context/pass_eval_context/pass_environment marks
        if hasattr(original, attr):
            setattr(run, attr, getattr(original, attr))
    return run


class ChatTemplate:
    """A model's chat template: ``path`` and ``key`` say where it came from (for every error)."""

    def __init__(
        self, text: Any, path: str | PathLike[str] | None, key: str
    ) -> None:  # text: str, or named templates (a list)
        if isinstance(text, list):  # tokenizer_config.json may hold named templates: use "default"
            named = {t.get("name"): t.get("template") for t in text if isinstance(t, dict)}
            text = named.get("default", next(iter(named.values()), None))
        self.text, self.path, self.key = text, path, key

    def _error(self, cls: type[ModelLoadError], detail: str) -> ModelLoadError:
        return cls(self.path, f"chat template {self.key}: {detail}")

    @cached_property
    def _template(self) -> Any:  # a compiled jinja2 Template
        if not isinstance(self.text, str):
            raise self._error(ChatTemplateError, f"is a {type(self.text).__name__}, not a string")
        if len(self.text) > MAX_TEMPLATE_CHARS:
            raise self._error(UnsafeTemplate, f"is {len(self.text)} characters, over the cap of {MAX_TEMPLATE_CHARS}")
        try:
            return _env().from_string(self.text)
        except RecursionError:
            raise self._error(UnsafeTemplate, "nests too deeply to compile") from None
        except Exception as e:
            raise self._error(ChatTemplateError, f"does not compile: {_one_line(e)}") from e

    def render(self, **variables: Any) -> str:
        from jinja2.exceptions import SecurityError

        template = self._template
        extra = sum(len(str(m.get("content", ""))) for m in variables.get("messages") or () if isinstance(m, dict))
        budget = _Budget(MAX_CHARS + 4 * extra)
        token = _BUDGET.set(budget)
        try:
            out, n = [], 0
            for piece in template.generate(**variables):
                n += len(piece)
                budget.size(n, "the rendered prompt")
                out.append(piece)
            return "".join(out)
        except _Limit as e:
            raise self._error(UnsafeTemplate, f"stopped: {e}") from None
        except SecurityError as e:
            raise self._error(UnsafeTemplate, f"refused by the sandbox: {_one_line(e)}") from None
        except (RecursionError, MemoryError, OverflowError) as e:
            # Python words a RecursionError by where the stack ran out ("... while calling a Python
            # object"): the limit is what the user needs to know.
            reason = "maximum recursion depth exceeded" if isinstance(e, RecursionError) else _one_line(e)
            raise self._error(UnsafeTemplate, f"stopped: {type(e).__name__}: {reason}") from None
        except Exception as e:  # TemplateError, raise_exception(), a TypeError inside the template…
            raise self._error(ChatTemplateError, f"failed: {_one_line(e)}") from e
        finally:
            _BUDGET.reset(token)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:300] or type(e).__name__
