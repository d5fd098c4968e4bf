"""The engine on CPUs this host is not: AVX2-only and SSE-only x86-64 CPU models under qemu-user.

    make cpu-models-check      # = python packaging/cpu_models_check.py [--model NAME ...]
    python packaging/cpu_models_check.py --suite [--model EPYC-Rome]   # the kernel tests there

qemu-x86_64 runs this checkout's own venv python on an emulated CPU model whose CPUID is what that
CPU reports (QEMU's TCG implements AVX2 but no AVX-512 and no AVX-VNNI, so an instruction the model
lacks faults with SIGILL rather than running). With an empty kernel cache and no compiler on PATH,
for each model it checks what a user of that CPU would get:

- ``opscope fastpath`` chooses the variant that CPU runs by itself (no OPSCOPE_CPU_VARIANT), from
  ``prebuilt/``;
- packaging/arm_guest.py: that library's ops for every type against the gguf-dequantize x float64
  references made here (exact and int8 matvecs, the prefill GEMMs);
- ``opscope generate`` on the embedded model prints the text the same variant prints natively here.

About a minute per model (torch's import alone takes ~12 s under emulation). ``--suite`` runs the
kernel and fused-decode test files (SUITE) with pytest on that CPU model instead (~80 min for EPYC-Rome): every
variant choice, reference and llama.cpp comparison in them made by a process whose CPU has no
AVX-512. Not the torch.compile tests: Inductor compiles with the host's ``g++ -march=native``, which
emits the host's AVX-512 for the emulated process. Not the tests that run ``opscope`` as a
subprocess either: qemu-user does not follow execve, so the child runs natively. x86-64 Linux only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import arm_check
from arm_guest import PROMPT, TOKENS  # the ARM guest's generation: the same prompt
from opscope.engine.fastpath.kernels import build, variants

HERE = Path(__file__).resolve().parent
# QEMU CPU model -> the variant that CPU must get. EPYC-Rome: Zen 2, the AVX2-only EPYC
# (AVX2, FMA, F16C, no AVX-512); Haswell-v4: Intel's first AVX2 core; Nehalem: SSE4.2, no AVX.
MODELS = {"EPYC-Rome": "avx2", "Haswell-v4": "avx2", "Nehalem": "baseline"}
# what an AVX2 CPU stood in for natively runs (ATen, MKL and oneDNN held to AVX2 as on that CPU)
STAND_IN = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
# the kernel tests that ask the CPU (in-process: the variant tests' children would run natively)
SUITE = tuple(
    f"tests/engine/fastpath/{name}.py"
    for name in ("test_kernels_types", "test_fastpath_q4_0", "test_prefill", "test_prefill_threads",
                 "test_fastpath_kernels", "test_real_types", "test_fastpath_model")
)  # fmt: skip


def qemu() -> str:
    return shutil.which("qemu-x86_64") or "/usr/bin/qemu-x86_64"


def guest_env(work: Path) -> dict[str, str]:
    empty = work / "empty-path"
    empty.mkdir(exist_ok=True)
    return {
        "HOME": os.environ.get("HOME", "/"),
        "PATH": str(empty),  # no compiler: the library can only come from prebuilt/
        "OPSCOPE_KERNEL_CACHE": str(work / "kernel-cache"),
        "PYTHONUNBUFFERED": "1",
    }


def run(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    out.stderr = "\n".join(ln for ln in out.stderr.splitlines() if "TCG doesn't support" not in ln)
    return out


def generate(prefix: list[str], env: dict[str, str], db: Path) -> dict:
    cmd = [*prefix, "-m", "opscope", "generate", "--db", str(db), "--json", "--threads", "2"]
    out = run([*cmd, "--max-tokens", str(TOKENS), PROMPT], env)
    if out.returncode != 0:
        return {"error": out.stderr.strip().splitlines()[-1:] or [f"exit {out.returncode}"]}
    return json.loads(out.stdout)


def check(model: str, expected: str, inputs: Path, work: Path) -> list[str]:
    """What failed for ``model`` (empty: all held), printing each step's outcome."""
    emu = [qemu(), "-cpu", model, sys.executable]
    env = guest_env(work)
    failed = []
    t0 = time.time()
    out = run([*emu, "-m", "opscope", "fastpath"], env)
    lines = out.stdout.splitlines()
    print(f"{model}: {' / '.join(lines[:2]) or out.stderr.strip()}", flush=True)
    if out.returncode != 0 or not lines or not lines[0].startswith(f"variant {expected}: "):
        failed.append(f"fastpath chose {lines[0] if lines else out.returncode}, not {expected}")
    elif not lines[1].startswith("library prebuilt: "):
        failed.append(f"library not prebuilt: {lines[1]}")
    out = run([*emu, str(HERE / "arm_guest.py"), str(inputs), expected], env)
    verdict = (out.stdout.strip().splitlines() or [out.stderr.strip()])[-1]
    print(f"{model}: ops: {verdict}", flush=True)
    if out.returncode != 0:
        failed.append(f"ops: {verdict}")
        print(out.stdout + out.stderr, file=sys.stderr)
    native_env = {**os.environ, **guest_env(work), variants.ENV: expected, **STAND_IN}
    native = generate([sys.executable], native_env, work / "runs.sqlite")
    emulated = generate(emu, env, work / "runs.sqlite")
    path = f"{emulated.get('cpu_kernels')} kernels" if emulated.get("fastpath") == "on" else "plain torch"
    print(
        f"{model}: generate ({path}): {emulated.get('text', emulated)!r}; natively: {native.get('text', native)!r}",
        flush=True,
    )
    if "text" not in emulated or emulated.get("text") != native.get("text"):
        failed.append("generate's text differs from the native run's")
    print(f"{model}: {'ok' if not failed else 'FAILED'} ({time.time() - t0:.0f} s)", flush=True)
    return failed


def suite(model: str) -> int:
    """pytest over SUITE in a process on ``model``; its exit status."""
    cmd = [qemu(), "-cpu", model, sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"]
    print(f"{model}: {' '.join(SUITE)}", flush=True)
    # no per-test timeout: a transformers comparison alone takes ~10 min under TCG (600 s natively is generous)
    return subprocess.run([*cmd, "-rs", "--timeout=0", "-k", "not compile", *SUITE], cwd=HERE.parent).returncode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", choices=sorted(MODELS), help="default: all")
    ap.add_argument("--cache", default=str(build.cache_root().parent / "cross"), help="the references' file")
    ap.add_argument("--suite", action="store_true", help="run the kernel test files on the model(s) instead")
    a = ap.parse_args(argv)
    if variants.arch() != "x86_64" or sys.platform != "linux":
        print(f"cpu_models_check: x86-64 Linux only (this is {variants.arch()}, {sys.platform})", file=sys.stderr)
        return 2
    if not Path(qemu()).is_file():
        print("cpu_models_check: no qemu-x86_64 here: apt-get install qemu-user", file=sys.stderr)
        return 2
    if a.suite:
        return max(suite(model) for model in a.model or ["EPYC-Rome"])
    inputs = Path(a.cache) / "arm_check_inputs.pt"
    inputs.parent.mkdir(parents=True, exist_ok=True)
    arm_check.make_inputs(inputs)
    failures = {}
    for model in a.model or list(MODELS):
        with tempfile.TemporaryDirectory(prefix=f"opscope-{model}-") as work:
            failures[model] = check(model, MODELS[model], inputs, Path(work))
    for model, failed in failures.items():
        for f in failed:
            print(f"cpu_models_check: {model}: {f}", file=sys.stderr)
    return 1 if any(failures.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
