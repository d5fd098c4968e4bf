"""engine.core.heap: with the fast path's keep_heap (the default) a prompt's temporaries are reused,
not faulted in afresh each pass. Real child processes (the setting is process-wide) load the
embedded model and count their minor page faults over repeated 512-token prefills."""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

CHILD = r"""
import json, resource, sys, torch
torch.set_num_threads(2)
from opscope.engine.api import load
from opscope.engine.core.defaults import default_model_path
lm = load(str(default_model_path()), threads=2, fastpath=sys.argv[1])
m = lm.model
m.setup_cache(1, 512)
toks = torch.randint(100, 20000, (1, 512))
with torch.inference_mode():
    m(toks, 0, last_only=True)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(3):
        m(toks, 0, last_only=True)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
print(json.dumps({"faults_per_pass": (after - before) / 3}))
"""


def faults_per_pass(spec: str) -> float:
    out = subprocess.run([sys.executable, "-c", CHILD, spec], capture_output=True, text=True, timeout=300, check=True)
    return json.loads(out.stdout.splitlines()[-1])["faults_per_pass"]


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt's thresholds are glibc's")
def test_a_prefill_pass_reuses_the_heap_instead_of_faulting_in_fresh_pages():
    # 512 tokens of the int8 prefill on two threads free and take again tens of MB per pass; with
    # glibc's defaults a pass faulted in 5,000-60,000 fresh pages here (keep_heap=0, which varies
    # with the order of the first frees); kept, only a buffer that grows takes new pages
    kept = faults_per_pass("activations=q8")
    assert kept < 2_000, kept


def test_keep_freed_memory_says_whether_it_holds():
    from opscope.engine.core import heap

    assert heap.keep_freed_memory() is (platform.system() == "Linux" and platform.libc_ver()[0] == "glibc")
