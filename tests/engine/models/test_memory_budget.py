"""Peak RSS of the fast path: the mapped file is not kept resident beside the packed copies, a model
built on meta imports no sympy, and a pp/tg run stays within file + KV cache + 450 MiB."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
MiB = 2**20


def _rss_file_kb() -> int:
    return int(
        next(ln for ln in Path("/proc/self/status").read_text().splitlines() if ln.startswith("RssFile:")).split()[1]
    )


def test_release_pages_drops_the_mapped_file_from_rss(default_model_path):
    import numpy as np
    from opscope.engine.formats import open_model

    source = open_model(str(default_model_path))
    source.release_pages()
    before = _rss_file_kb()
    touched = sum(
        int(np.asarray(source.raw_tensor(n)[1]).sum() & 1) for n in source.tensor_names() if not n.startswith("rope")
    )
    read = _rss_file_kb() - before
    assert touched >= 0 and read * 1024 > 0.8 * default_model_path.stat().st_size, read
    source.release_pages()
    assert _rss_file_kb() - before < 0.1 * read, "the mapped file stayed resident"
    assert source.raw_tensor("layers.0.attn.q_proj.weight")[1].size  # still readable afterwards


def _child(code: str) -> dict:
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_model_built_on_meta_imports_no_sympy():
    """Python meta kernels (normal_, scalar ** tensor) import ~800 modules, +70 MB RSS for good."""
    got = _child("""
import json, sys, torch
from opscope.engine.formats import open_model
from opscope.engine.models.transformer import Transformer
with torch.device("meta"):
    Transformer(open_model(None).config)
print(json.dumps({"sympy": "sympy" in sys.modules}))
""")
    assert got["sympy"] is False


@pytest.mark.slow
def test_pp_and_tg_peak_rss_within_file_kv_and_450_mib(default_model_path):
    """The llm suite's own pp and tg points in a fresh process; its peak RSS (VmHWM) against the budget."""
    got = _child("""
import json, torch
from pathlib import Path
from opscope.engine.api import load
from opscope.engine.bench.measure.options import BenchOptions
from opscope.engine.bench.suites import llm
torch.set_num_threads(1)
lm = load(None, threads=1)
pk, opts = {"flop_s": None, "bytes_s": None}, BenchOptions(threads=1)
llm.pp_point(lm, 128, 0, opts, pk).prepare()()
llm.tg_point(lm, 8, 0, opts, pk).prepare()()
cfg = lm.config
hwm = next(ln for ln in Path("/proc/self/status").read_text().splitlines() if ln.startswith("VmHWM"))
print(json.dumps({"peak": int(hwm.split()[1]) * 1024, "fast": lm.describe()["fastpath"],
                  "kv": 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 4 * 128}))
""")
    if got["fast"] == "off":
        pytest.skip("the fast path is not active (no C compiler here)")
    budget = default_model_path.stat().st_size + got["kv"] + 450 * MiB
    assert got["peak"] <= budget, f"peak RSS {got['peak'] / MiB:.0f} MiB > budget {budget / MiB:.0f} MiB"
