"""The peers suite: interleaved rounds, per-peer figures and ratios, typed errors for bad input."""

from __future__ import annotations

import os

import pytest
from opscope.engine.fastpath.kernels.build import cache_root

os.environ.setdefault("OPSCOPE_KERNEL_CACHE", str(cache_root()))  # see tests/engine/fastpath/test_fastpath_model.py

from opscope.engine.bench.measure.options import BenchOptions
from opscope.engine.bench.suites import get_suite
from opscope.engine.core.errors import ConfigError


def test_suite_is_registered():
    assert get_suite("peers").NAME == "peers"


def test_unknown_peer_and_non_gguf_model_are_config_errors(tmp_path):
    peers = get_suite("peers")
    with pytest.raises(ConfigError, match="unknown peer"):
        peers.make_peer("vllm", tmp_path / "m.gguf", 2, peers.Params())
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ConfigError, match="one GGUF file"):
        peers.plan(BenchOptions(model=str(tmp_path / "model.safetensors")))


def test_first_peer_must_be_opscope(default_model_path):
    peers = get_suite("peers")
    with pytest.raises(ConfigError, match="must start with 'opscope'"):
        peers.plan(BenchOptions(model=str(default_model_path)), peers.Params(peers=("opscope:weights=dense",)))


@pytest.mark.slow
def test_quick_run_records_each_peer_and_its_ratio(default_model_2_layers):
    """On the default model's first 2 layers: what is recorded per peer does not depend on depth."""
    from opscope.engine.bench.session import run_suite

    peers = get_suite("peers")
    params = peers.Params(pp=16, tg=4, peers=("opscope", "opscope:weights=dense"), load_peers=("opscope",))
    options = BenchOptions(model=str(default_model_2_layers), quick=True, threads=1)
    _, result = run_suite("peers", options, params=params)
    assert result.status == "completed", result.error
    by_name = {m.name: m for m in result.metrics}
    for name in (
        "pp16.opscope",
        "pp16.opscope:weights=dense",
        "tg4.opscope",
        "tg4.ratio.opscope:weights=dense",
        "load.opscope",
    ):
        assert by_name[name].status == "ok" and len(by_name[name].samples) >= 3, name
        assert all(v > 0 for v in by_name[name].samples), name
    assert result.settings["suite_params"]["peers"] == ["opscope", "opscope:weights=dense"]
