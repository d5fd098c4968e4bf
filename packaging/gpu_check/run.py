"""OpScope's first-contact GPU check: one headless run of every CUDA, NVML and NCCL path.

    python packaging/gpu_check/run.py --out DIR          # on a machine with an NVIDIA GPU (make gpu-check)
    python packaging/gpu_check/run.py --out DIR --dry    # on the CPU: what needs no GPU runs (make gpu-check-dry)

Writes DIR/report.md, DIR/report.json and DIR/logs/ (every command's output), and exits 1 naming
each failed check, 0 when none failed. Setup (wheels from .whl/, the models) is part of the run.
docs/gpu.md says how to run it on a lent GPU machine.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import bench_checks
import checks
import report
from harness import CheckFailed, Ctx, Outcome, prepare_env, run_check

REPO = Path(__file__).resolve().parent.parent.parent
# On an H100 the whole run, its setup included, must end inside 8 minutes (issue 26); each check
# also has its own limit, so one hang cannot eat the rest.
BUDGET_S = 450.0

# name → (function, needs a GPU), in the order they run: cheap and fundamental first, so a budget
# that runs out cuts the least.
PLAN: list[tuple[str, Callable[[Ctx], dict[str, Any]], bool]] = [
    ("environment", checks.environment, False),
    ("models-tiny", checks.models_tiny, False),
    ("cpu-reference", checks.cpu_reference, False),
    ("generate-cuda-float32", checks.generate_cuda_float32, True),
    ("logits", checks.logits, False),
    ("trace-clean", checks.trace_clean, False),
    ("trace-leaky-norm", checks.trace_leaky_norm, False),
    ("trace-slow-train", checks.trace_slow_train, False),
    ("trace-fast-train", checks.trace_fast_train, False),
    ("generate-nproc1", checks.generate_nproc1, False),
    ("models-large", checks.models_large, False),  # its writers load the CPU: benches come after
    ("bench-bandwidth", bench_checks.bench_bandwidth, True),
    ("generate-large", checks.generate_large, True),
    ("decode-steps", checks.decode_steps, False),
    ("energy", bench_checks.energy, True),
    ("bench-llm-telemetry", bench_checks.llm_with_telemetry, True),
    ("bench-matmul", bench_checks.bench_matmul, True),
    ("bench-attention", bench_checks.bench_attention, True),
    ("store-compare", bench_checks.store_compare, False),
    ("bench-collectives", bench_checks.bench_collectives, False),
    ("bench-crossover", bench_checks.bench_crossover, True),
    ("generate-compile-decode", checks.generate_compile_decode, True),
]


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="gpu_check", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="directory for report.md, report.json, logs/")
    ap.add_argument("--dry", action="store_true", help="run on the CPU: GPU-only checks are listed as skipped")
    ap.add_argument(
        "--budget", type=float, default=BUDGET_S, help=f"seconds for the whole run (default {BUDGET_S:.0f})"
    )
    ap.add_argument("--wheels", type=Path, default=REPO / ".whl", help="wheels for what the image lacks (default .whl)")
    ap.add_argument("--only", default="", help="comma-separated check names to run (the others are skipped)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    a = parse(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    ctx = Ctx(a.out.resolve(), REPO, sys.executable, a.dry, a.budget)
    started, t0 = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), time.monotonic()
    outcomes = [_setup(ctx, a.wheels)]
    only = {n for n in a.only.split(",") if n}
    try:
        for name, fn, needs_gpu in PLAN:
            if only and name not in only:
                outcomes.append(Outcome(name, "skip", "not asked for (--only)"))
                continue
            if outcomes[0].status == "fail":
                outcomes.append(Outcome(name, "fail", "not run: setup failed"))
                continue
            outcomes.append(run_check(ctx, name, fn, needs_gpu))
    finally:
        ctx.stop_background()
    meta = {
        "mode": "dry (CPU)" if a.dry else "GPU",
        "started": started,
        "seconds": time.monotonic() - t0,
        "budget_s": a.budget,
        "git": _git(REPO),
        "out": str(ctx.out),
    }
    report.write(ctx.out, meta, outcomes)
    code, line = report.verdict(outcomes)
    print(line, file=sys.stderr)
    print(f"report: {ctx.out / 'report.md'}", file=sys.stderr)
    return code


def _setup(ctx: Ctx, wheels: Path) -> Outcome:
    t0 = time.monotonic()
    try:
        figures = prepare_env(ctx, wheels)
    except CheckFailed as e:
        return Outcome("setup", "fail", str(e), round(time.monotonic() - t0, 2))
    return Outcome("setup", "pass", "", round(time.monotonic() - t0, 2), figures, list(ctx.commands))


def _git(repo: Path) -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(repo), "describe", "--always", "--dirty"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown (no git)"
    return out.stdout.strip() or "unknown (not a git checkout)"


if __name__ == "__main__":
    sys.exit(main())
