"""Errors speak to whoever called: an API caller reads keyword options, the `opscope` command its flags."""

from __future__ import annotations

import pickle

import pytest
from opscope.engine.api import load
from opscope.engine.cli.main import main
from opscope.engine.core.errors import ConfigError


def test_load_options_errors_name_keywords_for_api_callers():
    with pytest.raises(ConfigError) as e:
        load(compile="always")
    assert str(e.value) == "compile='always' is not one of off, decode"
    with pytest.raises(ConfigError) as e:
        load(quantize="int8", fastpath="activations=q8")
    assert str(e.value) == (
        "compile and quantize apply to the plain torch model; add fastpath='off' "
        "(the fast path keeps the GGUF's own quantized blocks)"
    )


def test_the_same_error_names_flags_on_the_command_line(capsys):
    code = main(["generate", "--quantize", "int8", "--fastpath", "activations=q8", "hi"])
    assert code == 2
    assert capsys.readouterr().err.strip() == (
        "opscope: error: --compile and --quantize apply to the plain torch model; add --fastpath off "
        "(the fast path keeps the GGUF's own quantized blocks)"
    )


def test_option_error_keeps_both_wordings_across_the_worker_boundary():
    err = ConfigError.about_options(
        "{dtype=} is not usable here; use {dtype=float32} or lower {max_tokens}", dtype="fp8"
    )
    assert str(err) == "dtype='fp8' is not usable here; use dtype='float32' or lower max_tokens"
    assert err.for_cli() == "--dtype 'fp8' is not usable here; use --dtype float32 or lower --max-tokens"
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is ConfigError and str(back) == str(err) and back.for_cli() == err.for_cli()
