"""The peers suite's llama-bench peer: finding the binary, running it, its samples beside OpScope's.

Runs the real llama-bench that the project's tools folder holds (../shared/tools/llama.cpp, which CI
has); small -p/-n keep it to about a second per call.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from opscope.engine.fastpath.kernels.build import cache_root

os.environ.setdefault("OPSCOPE_KERNEL_CACHE", str(cache_root()))  # see tests/engine/fastpath/test_fastpath_model.py

from opscope.engine.bench.measure.options import BenchOptions
from opscope.engine.bench.peers import llama_bench
from opscope.engine.bench.suites import get_suite
from opscope.engine.core.errors import ConfigError

REPO = Path(__file__).resolve().parents[3]
LLAMA_BENCH = REPO.parent / "shared" / "tools" / "llama.cpp" / "llama-bench"


@pytest.fixture(scope="module")
def binary() -> Path:
    if not LLAMA_BENCH.is_file():
        pytest.fail(
            f"llama-bench is missing at {LLAMA_BENCH}: these tests need llama.cpp's tools "
            f"(see ../shared/tools/llama.cpp/BUILD.md)"
        )
    return LLAMA_BENCH


def _fake_binary(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "llama-bench"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_explicit_path_wins_and_a_missing_one_is_a_config_error(tmp_path, monkeypatch, binary):
    monkeypatch.setenv(llama_bench.ENV_VAR, str(binary))
    assert llama_bench.find_binary() == binary
    assert llama_bench.find_binary(str(binary)) == binary
    with pytest.raises(ConfigError, match="not found at .*nope.*llama_bench parameter"):
        llama_bench.find_binary(str(tmp_path / "nope"))
    monkeypatch.setenv(llama_bench.ENV_VAR, str(tmp_path / "gone"))
    with pytest.raises(ConfigError, match=f"not found at .*gone.*{llama_bench.ENV_VAR}"):
        llama_bench.find_binary()


def test_found_on_path(monkeypatch, binary):
    monkeypatch.delenv(llama_bench.ENV_VAR, raising=False)
    monkeypatch.setenv("PATH", f"{binary.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    assert llama_bench.find_binary() == binary
    monkeypatch.setenv("PATH", "/nonexistent")
    assert llama_bench.find_binary() is None


def test_a_binary_that_does_not_run_is_a_config_error(tmp_path, binary):
    assert "version" in llama_bench.check_binary(binary)
    broken = _fake_binary(tmp_path, "echo 'error while loading shared libraries: libggml.so' >&2; exit 127")
    with pytest.raises(ConfigError, match="does not run .*libggml"):
        llama_bench.check_binary(broken)


def test_one_run_gives_pp_and_tg_samples_and_peak_rss(binary, default_model_path):
    run = llama_bench.run(binary, default_model_path, n_prompt=8, n_gen=2, threads=1)
    assert run.n_prompt == 8 and run.n_gen == 2
    assert len(run.pp_s) == 1 and len(run.tg_s) == 1 and run.pp_s[0] > 0 and run.tg_s[0] > 0
    # the model file is memory-mapped and read: the child's own peak RSS holds at least most of it
    assert run.peak_rss_bytes > 0.5 * default_model_path.stat().st_size
    assert run.info["model_n_params"] > 100e6 and run.info["n_threads"] == 1
    # llama-bench's own figure (avg_ts, what the agreement benchmark compares against): mean of n/t
    assert run.pp_avg_ts == pytest.approx(8 / run.pp_s[0], rel=1e-5)
    assert run.tg_avg_ts == pytest.approx(2 / run.tg_s[0], rel=1e-5)


def test_a_failing_run_says_why(tmp_path, binary):
    with pytest.raises(RuntimeError, match="llama-bench failed on nope.gguf"):
        llama_bench.run(binary, tmp_path / "nope.gguf", n_prompt=8, n_gen=0, threads=1)


def test_cli_bad_binary_path_is_one_line_exit_2(tmp_path, capsys, default_model_path):
    from opscope.engine.cli.main import main

    db = str(tmp_path / "runs.db")
    code = main(
        [
            "--db",
            db,
            "bench",
            "peers",
            "--model",
            str(default_model_path),
            "--quick",
            "--no-save",
            "--param",
            "peers=opscope,llama_bench",
            "--param",
            f"llama_bench={tmp_path / 'nope'}",
        ]
    )
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and "llama-bench not found at" in err, err


def test_no_binary_anywhere_is_a_skipped_peer(monkeypatch, default_model_path):
    monkeypatch.delenv(llama_bench.ENV_VAR, raising=False)
    monkeypatch.setenv("PATH", "/nonexistent")
    peers = get_suite("peers")
    plan = peers.plan(
        BenchOptions(model=str(default_model_path), threads=1),
        peers.Params(pp=8, tg=2, peers=("opscope", "llama_bench"), load_peers=()),
    )
    try:
        assert "llama_bench" in plan.settings["missing_peers"]
        assert "OPSCOPE_LLAMA_BENCH" in plan.settings["missing_peers"]["llama_bench"]
    finally:
        plan.close()


@pytest.mark.slow
def test_suite_records_llama_bench_samples_beside_opscope(binary, monkeypatch, default_model_2_layers):
    """On the default model's first 2 layers, for both peers: what is recorded does not depend on depth."""
    from opscope.engine.bench.session import run_suite

    monkeypatch.delenv(llama_bench.ENV_VAR, raising=False)
    peers = get_suite("peers")
    params = peers.Params(
        pp=16, tg=4, peers=("opscope", "llama_bench"), load_peers=("opscope", "llama_bench"), llama_bench=str(binary)
    )
    options = BenchOptions(model=str(default_model_2_layers), quick=True, threads=1)
    _, result = run_suite("peers", options, params=params)
    assert result.status == "completed", result.error
    by_name = {m.name: m for m in result.metrics}
    for name in (
        "pp16.llama_bench",
        "tg4.llama_bench",
        "pp16.ratio.llama_bench",
        "tg4.ratio.llama_bench",
        "pp16.opscope",
        "tg4.opscope",
    ):
        assert by_name[name].status == "ok" and len(by_name[name].samples) >= 3, name
        assert all(v > 0 for v in by_name[name].samples), name
    assert "load.llama_bench" not in by_name  # each llama-bench round loads in its own process
    assert result.settings["suite_params"]["llama_bench_binaries"]["llama_bench"]["binary"] == str(binary)
