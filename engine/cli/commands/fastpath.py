"""`opscope fastpath build`: compile (or find) the CPU fast-path kernels and say what they use."""
from __future__ import annotations

import argparse


def register(subparsers) -> None:
    p = subparsers.add_parser("fastpath", help="CPU fast-path kernels",
                              description="Build the CPU fast-path kernels once (a few minutes) and report them.")
    sub = p.add_subparsers(dest="fastpath_cmd", required=True)
    b = sub.add_parser("build", help="compile the kernels for this CPU, or find the cached build")
    b.set_defaults(func=cmd_build)


def cmd_build(args: argparse.Namespace) -> int:
    from opscope.engine.core.clock import now_ns
    from opscope.engine.fastpath.kernels import load_kernels
    from opscope.engine.fastpath.kernels.build import build_key, cache_root

    t0 = now_ns()
    kern = load_kernels()  # KernelBuildError (an EngineError) says what is missing
    print(f"kernels {build_key()} ready in {(now_ns() - t0) / 1e9:.1f} s at {cache_root()}: "
          f"avx512={kern.has_avx512()} vnni={kern.has_vnni()}")
    return 0
