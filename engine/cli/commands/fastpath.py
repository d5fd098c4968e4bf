"""`opscope fastpath`: which CPU kernel variant runs here and why; `opscope fastpath build`: load
it (compiling it only where no prebuilt library fits) and report it."""

from __future__ import annotations

import argparse


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "fastpath",
        help="CPU fast-path kernels",
        description="Say which CPU kernel variant runs on this machine and why; "
        "`build` loads it (compiling it where no prebuilt one fits).",
    )
    p.set_defaults(func=cmd_info)
    sub = p.add_subparsers(dest="fastpath_cmd")
    b = sub.add_parser("build", help="load the kernels for this CPU: the prebuilt variant, else compile it")
    b.add_argument(
        "--all",
        action="store_true",
        help="compile every variant of this architecture ahead of time into the package's "
        "prebuilt folder (what `make dist` and `make bundle` run)",
    )
    b.add_argument(
        "--runnable",
        action="store_true",
        help="compile ahead of time only the variants this CPU can run (what `make setup` runs; "
        "`make dist` builds them all for the wheel)",
    )
    b.set_defaults(func=cmd_build)


def cmd_info(args: argparse.Namespace) -> int:
    """One line for the variant and why, one for where its library comes from, one for the
    activation modes it runs."""
    from opscope.engine.fastpath.kernels import build, int8_prefill, native_bf16, variants

    v = build.variant()  # VariantError (an EngineError): an override this CPU cannot run, in one line
    print(f"variant {variants.reason(v)}")
    print(f"library {build.library_origin(v)}")
    q8 = "int8 kernels for every quantized type" if v.int8 else "no int8 kernels here, so it runs float32"
    other = "bfloat16 (native on this CPU)" if native_bf16() else ""
    if v.int8 and int8_prefill():
        q8 += _int8_prefill_line(other or "float32")
    elif other:
        q8 += f"; prefill GEMMs in {other}"
    print(f"activations float32, exact (default); activations=q8 (llama.cpp's int8 scheme): {q8}")
    others = [
        f"{o.name} (lacks {' '.join(build.variants.missing(o))})"
        for o in variants.for_arch()
        if not variants.can_run(o)
    ]
    if others:
        print(f"not on this CPU: {', '.join(others)}")
    return 0


def _int8_prefill_line(fallback: str) -> str:
    """Which types' prefill GEMMs run in int8 here, and what the others take."""
    from opscope.engine.fastpath.kernels.packing import RAW_TYPES
    from opscope.engine.fastpath.qlinear import int8_prefill_types

    int8 = set(int8_prefill_types())
    rest = [t for t in RAW_TYPES if t not in int8 and t not in ("F32", "F16", "BF16")] + ["F16", "BF16"]
    if rest == ["F16", "BF16"] and fallback == "float32":
        return "; prefill GEMMs in int8 for every quantized type"
    return f"; prefill GEMMs in int8, in {fallback} for {', '.join(rest[:-1])} and {rest[-1]}"


def cmd_build(args: argparse.Namespace) -> int:
    from opscope.engine.core.clock import now_ns
    from opscope.engine.fastpath.kernels import build, load_kernels, variants

    t0 = now_ns()
    if args.all or args.runnable:
        names = None if args.all else [v.name for v in variants.runnable()]
        for line in build.prebuild(build.prebuilt_root(), names):
            print(line)
        return 0
    kern = load_kernels()  # KernelBuildError (an EngineError) says what is missing
    print(
        f"kernels {build.build_key()} ready in {(now_ns() - t0) / 1e9:.1f} s: {variants.reason(build.variant())}; "
        f"avx512={kern.has_avx512()} vnni={kern.has_vnni()}"
    )
    return 0
