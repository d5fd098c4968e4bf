"""Every JSON a command prints is strict JSON: an unknown number is null, never NaN/Infinity."""

from __future__ import annotations

import json
import math

from opscope.engine.core import json_output


def _strict(text: str):
    """Parse as jq or JavaScript would: the bare NaN/Infinity tokens Python writes are errors."""

    def reject(token):
        raise ValueError(f"not JSON: {token}")

    return json.loads(text, parse_constant=reject)


def test_non_finite_numbers_become_null_at_any_depth():
    value = {"a": math.nan, "b": [1.5, -math.inf, {"c": (math.inf, 2)}], "d": "NaN"}
    assert _strict(json_output.dumps(value)) == {"a": None, "b": [1.5, None, {"c": [None, 2]}], "d": "NaN"}


def test_a_default_converter_cannot_smuggle_nan_in():
    class Odd:
        pass

    assert _strict(json_output.dumps({"x": Odd()}, default=lambda o: math.nan)) == {"x": None}


def test_generate_json_energy_unknown_is_null(lm, capsys):
    from opscope.engine.cli.commands.generate import generate_with
    from opscope.engine.cli.main import build_parser

    args = build_parser(argv=["generate"]).parse_args(["generate", "Hi", "-n", "2", "--json", "--seed", "0"])
    assert generate_with(lm, args) == 0
    out = _strict(capsys.readouterr().out)  # before: "prefill_j_per_token": NaN, which jq rejects
    for key in ("prefill_j_per_token", "decode_j_per_token"):
        assert out[key] is None or math.isfinite(out[key]), key
