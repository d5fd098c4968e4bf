"""A suite's Params: each field described once where it is declared (``param``: label, unit, help,
read by ``opscope bench SUITE --help`` and the window's form), and built from user values: the GUI's
form (typed values) or ``opscope bench --param KEY=VALUE`` (strings, converted by the type of the
field's default)."""

from __future__ import annotations

import dataclasses
import json
import math

from opscope.engine.core.errors import ConfigError
from opscope.engine.core.textparse import parse_bool


@dataclasses.dataclass(frozen=True)
class ParamDoc:
    label: str  # "Call budget"
    unit: str = ""  # "s"; "" for a plain number, a name list or a switch
    help: str = ""  # what the parameter changes in the run

    @property
    def text(self) -> str:
        """The label with its unit once: "Call budget (s)"."""
        return f"{self.label} ({self.unit})" if self.unit else self.label


def param(default, label: str, unit: str = "", help: str = ""):
    """A suite Params field with its description: ``call_budget_s: float = param(2.0, "Call budget",
    "s", "Skip a size whose ...")``. Defaults are immutable (tuples), so one object serves every
    instance."""
    return dataclasses.field(default=default, metadata={"doc": ParamDoc(label, unit, help)})


def param_doc(field: dataclasses.Field) -> ParamDoc:
    """A field's description; a field declared without ``param`` gets a label from its name."""
    doc = field.metadata.get("doc")
    if doc is not None:
        return doc
    return ParamDoc(field.name.replace("_", " ").capitalize(), "", f"--param {field.name}=…")


def param_help_lines(params_cls) -> list[str]:
    """One line per field for ``opscope bench SUITE --help``:
    ``  call_budget_s=2.0  Call budget (s): Skip a size whose ...``."""
    lines = []
    for f in dataclasses.fields(params_cls):
        doc = param_doc(f)
        lines.append(f"  {f.name}={_shown(f.default)}  {doc.text}: {doc.help}")
    return lines


def _shown(value) -> str:
    """A default as it is typed after ``--param KEY=``: lists comma-separated."""
    if isinstance(value, tuple) and all(isinstance(v, (int, float, str)) for v in value):
        return ",".join(map(str, value))
    if isinstance(value, (int, float, str)):
        return str(value)
    return "(JSON)"


def _base(module, quick: bool):
    """The Params a run starts from: the suite's QUICK ones for ``--quick``, else its defaults."""
    return (getattr(module, "QUICK", None) if quick else None) or module.Params()


def build_params(module, values: dict, quick: bool):
    """The suite's Params from ``values`` (lists become tuples), starting from QUICK or defaults."""
    base = _base(module, quick)
    known = {f.name for f in dataclasses.fields(base)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"suite {module.NAME}: unknown parameter(s) {unknown}; known: {sorted(known)}")
    converted = {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}
    _check_choices(module, converted)
    try:
        return dataclasses.replace(base, **converted)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"suite {module.NAME}: bad parameters: {e}") from e


def _check_choices(module, values: dict) -> None:
    """A parameter whose values come from a fixed set (the suite's PARAM_CHOICES) names them all."""
    for key, allowed in getattr(module, "PARAM_CHOICES", {}).items():
        given = values.get(key, ())
        for value in given if isinstance(given, tuple) else (given,):
            if value not in allowed:
                raise ConfigError(f"--param {key}: {value!r} is not one of {', '.join(map(str, allowed))}")


def parse_cli_params(module, pairs: list[str], quick: bool):
    """``["peers=opscope,llama_cpp", "tg=64"]`` → the suite's Params (None when no pairs)."""
    if not pairs:
        return None
    return build_params(module, _cli_values(_base(module, quick), pairs), quick)


def override_cli_params(params, pairs: list[str]):
    """``params`` (a suite's Params) with ``KEY=VALUE`` pairs applied over them (an A/B side's
    ``--param`` flags over the form's values)."""
    return dataclasses.replace(params, **_cli_values(params, pairs)) if pairs else params


def _cli_values(base, pairs: list[str]) -> dict:
    defaults = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    values = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        key = key.strip()
        if not sep or key not in defaults:
            raise ConfigError(f"--param {pair!r}: expected KEY=VALUE with KEY one of {sorted(defaults)}")
        values[key] = _check_range(defaults[key], _convert(defaults[key], text.strip(), key), key)
    return values


def _check_range(default, value, key: str):
    """Every numeric suite parameter is a size, count, depth, time or rate: whole numbers at least 1
    and real numbers (a learning rate, a time budget) finite and > 0 — each at least 0 where the
    default itself uses 0 (e.g. a context depth of 0) — checked before anything loads."""
    items = default if isinstance(default, tuple) else (default,)
    numbers = [
        v
        for v in (value if isinstance(value, tuple) else (value,))
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    ]
    zero_ok = any(d == 0 for d in items if isinstance(d, (int, float)))
    for v in numbers:
        if isinstance(v, float):  # a rate or a time: any positive size, 0.003 as well as 1e-9
            bad = not math.isfinite(v) or v < 0 or (v == 0 and not zero_ok)
            low = "a finite number ≥ 0" if zero_ok else "a finite number > 0"
        else:
            bad, low = v < (0 if zero_ok else 1), f"a whole number ≥ {0 if zero_ok else 1}"
        if bad:
            raise ConfigError(f"--param {key}: {v} is out of range: use {low}")
    return value


def _convert(default, text: str, key: str):
    try:
        if isinstance(default, bool):
            return parse_bool(text)
        if isinstance(default, tuple):
            items = [s.strip() for s in text.split(",") if s.strip()]
            kinds = {type(v) for v in default}
            return (
                tuple(int(s) for s in items)
                if kinds == {int}
                else tuple(float(s) for s in items)
                if kinds == {float}
                else tuple(items)
            )
        if isinstance(default, (int, float, str)):
            return type(default)(text)
        return json.loads(text)
    except (ValueError, json.JSONDecodeError) as e:
        raise ConfigError(f"--param {key}: cannot read {text!r} as the type of its default ({default!r})") from e
