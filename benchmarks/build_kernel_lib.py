"""Compile the kernel library of one variant, with extra compiler flags, for an A/B (kernel_ab.py).

    python benchmarks/build_kernel_lib.py avx512 /tmp/hand512
    python benchmarks/build_kernel_lib.py avx512 /tmp/port512 -DOPSCOPE_PORTABLE_512
    OPSCOPE_CPU_VARIANT=avx512 python benchmarks/kernel_ab.py /tmp/hand512/*.so /tmp/port512/*.so

Prints the library's path. OPSCOPE_PORTABLE_512 builds an AVX-512 variant whose float32 matvecs
are the portable bodies over VecAVX512 instead of the hand-scheduled kernels (and which has no
int8 kernels for the raw types): the comparison in docs/decisions/cpu-variants.md.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    from opscope.engine.fastpath.kernels import build, toolchain, variants

    v, out, extra = variants.by_name(argv[0]), Path(argv[1]), tuple(argv[2:])
    name = f"opscope_ab_{out.name.replace('-', '_')}"
    built = build.compile_variants(toolchain.host(), [(v, name, out)], out / "half", extra)
    print(built[v.name])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
