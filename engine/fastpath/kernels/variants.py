"""The CPU variants of the kernels and the choice of one per process.

The kernel library is compiled once per instruction-set level (each with its own -m flags, the
portable kernels instantiated over vec.h's traits for it) and the best level the CPU can run is
loaded, as llama.cpp's GGML_CPU_ALL_VARIANTS and PyTorch's CPU-capability dispatch do.
``OPSCOPE_CPU_VARIANT`` names one instead (tests, benchmarks: an AVX2 host stood in for by an
AVX-512 one); a variant this CPU cannot run is refused in one line.
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from opscope.engine.core.errors import BackendError

ENV = "OPSCOPE_CPU_VARIANT"


class VariantError(BackendError):
    """A kernel variant that does not exist, or that this CPU cannot run."""


@dataclass(frozen=True)
class Variant:
    name: str
    arch: str  # platform.machine() family: "x86_64" or "aarch64"
    cflags: tuple[str, ...]
    needs: tuple[str, ...]  # CPU feature flags as /proc/cpuinfo names them
    summary: str
    int8: bool = False  # int8-activation kernels (activations=q8) for every quantized type


# Best first within an architecture. The x86 levels are the psABI's (x86-64-v3: AVX2, FMA, F16C,
# BMI1/2, LZCNT, MOVBE; v4: AVX-512 F/BW/CD/DQ/VL). avx2-vnni is x86-64-v3 plus AVX-VNNI (Alder
# Lake and later, Zen 5): the same kernels, its int8-activation matvecs on vpdpbusd instead of
# maddubs + madd. neon-i8mm is neon-dotprod plus ARMv8.6's int8 matrix multiply (Neoverse N2/V1/V2,
# Graviton 3 and 4, Apple M2 and later): its int8 prefill GEMM on smmla (2 tokens x 2 rows x 8 k
# per instruction, twice sdot's products); the matvecs are neon-dotprod's.
VARIANTS: tuple[Variant, ...] = (
    Variant(
        "avx512-vnni",
        "x86_64",
        ("-march=x86-64-v4", "-mavx512vnni", "-mtune=generic"),
        ("avx2", "fma", "f16c", "bmi2", "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx512_vnni"),
        "AVX-512 kernels with VNNI int8 dot products",
        int8=True,
    ),
    Variant(
        "avx512",
        "x86_64",
        ("-march=x86-64-v4", "-mtune=generic"),
        ("avx2", "fma", "f16c", "bmi2", "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"),
        "AVX-512 kernels",
    ),
    Variant(
        "avx2-vnni",
        "x86_64",
        ("-march=x86-64-v3", "-mavxvnni", "-mtune=generic"),
        ("avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "abm", "movbe", "avx_vnni"),
        "AVX2+FMA+F16C kernels (vec.h traits), AVX-VNNI int8 dot products",
        int8=True,
    ),
    Variant(
        "avx2",
        "x86_64",
        ("-march=x86-64-v3", "-mtune=generic"),
        ("avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "abm", "movbe"),
        "AVX2+FMA+F16C kernels (vec.h traits)",
        int8=True,
    ),
    Variant("baseline", "x86_64", ("-march=x86-64", "-mtune=generic"), (), "portable kernels (SSE2)"),
    Variant(
        "neon-i8mm",
        "aarch64",
        ("-march=armv8.2-a+dotprod+i8mm",),
        ("asimd", "asimddp", "i8mm"),
        "NEON kernels (vec.h traits), dotprod int8 dot products, i8mm (smmla) int8 prefill GEMM",
        int8=True,
    ),
    Variant(
        "neon-dotprod",
        "aarch64",
        ("-march=armv8.2-a+dotprod",),
        ("asimd", "asimddp"),
        "NEON kernels (vec.h traits), dotprod int8 dot products",
        int8=True,
    ),
    Variant(
        "neon",
        "aarch64",
        ("-march=armv8-a",),
        ("asimd",),
        "NEON kernels (vec.h traits), int8 by widening multiplies",
        int8=True,
    ),
)


def arch() -> str:
    m = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(m, m)


def for_arch(a: str | None = None) -> list[Variant]:
    a = a or arch()
    return [v for v in VARIANTS if v.arch == a]


def by_name(name: str) -> Variant:
    for v in VARIANTS:
        if v.name == name:
            return v
    raise VariantError(f"{ENV}={name}: no such kernel variant (known: {', '.join(v.name for v in VARIANTS)})")


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags, by /proc/cpuinfo's names: what both the OS (/proc/cpuinfo, Linux) and
    the CPU itself (CPUID, through torch's cpuinfo) report; either alone where the other is missing."""
    return merge_flags(_proc_flags(), _cpuid_flags())


def merge_flags(proc: frozenset[str] | None, cpuid: dict[str, bool] | None) -> frozenset[str]:
    """/proc/cpuinfo's flags less those CPUID denies (an emulator or hypervisor whose CPU model
    lacks what the host's kernel lists; the instructions would fault); CPUID's alone where there
    is no /proc/cpuinfo (macOS, Windows). cpuinfo has no MOVBE: every CPU with AVX2 has it."""
    if cpuid is None:
        return proc or frozenset()
    if proc is not None:
        return frozenset(f for f in proc if cpuid.get(f, True))
    have = {f for f, on in cpuid.items() if on}
    return frozenset(have | ({"movbe"} if "avx2" in have else set()))


# torch.cpu.get_capabilities()'s names that /proc/cpuinfo spells otherwise
_PROC_NAMES = {
    "fma3": "fma",
    "bmi": "bmi1",
    "lzcnt": "abm",
    "avx512_f": "avx512f",
    "avx512_bw": "avx512bw",
    "avx512_cd": "avx512cd",
    "avx512_dq": "avx512dq",
    "avx512_vl": "avx512vl",
    "neon": "asimd",
    "dot": "asimddp",
}


def _proc_flags() -> frozenset[str] | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


def _cpuid_flags() -> dict[str, bool] | None:
    """CPUID's features (with the OS's register state for AVX/AVX-512), as torch's dispatch reads
    them; None before torch 2.11 (no torch.cpu.get_capabilities), where macOS on ARM asks sysctl."""
    try:
        import torch

        caps = torch.cpu.get_capabilities()
    except (ImportError, AttributeError, RuntimeError):  # RuntimeError: cpuinfo could not read the CPU
        if arch() == "aarch64" and sys.platform == "darwin":  # every ARMv8-A core has asimd
            return {
                "asimd": True,
                "asimddp": _darwin_has("hw.optional.arm.FEAT_DotProd"),
                "i8mm": _darwin_has("hw.optional.arm.FEAT_I8MM"),  # M2 and later
            }
        return None
    return {_PROC_NAMES.get(k, k): v for k, v in caps.items() if isinstance(v, bool)}


def _darwin_has(feature: str) -> bool:
    """Whether macOS's sysctl reports CPU feature ``feature`` (1); False elsewhere or when unknown."""
    if sys.platform != "darwin":
        return False
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        value, size = ctypes.c_int(0), ctypes.c_size_t(ctypes.sizeof(ctypes.c_int))
        rc = libc.sysctlbyname(feature.encode(), ctypes.byref(value), ctypes.byref(size), None, ctypes.c_size_t(0))
    except (OSError, AttributeError):
        return False
    return rc == 0 and value.value == 1


def missing(v: Variant, flags: frozenset[str] | None = None) -> list[str]:
    """The features ``v`` needs that this CPU lacks (another architecture: its name)."""
    if v.arch != arch():
        return [v.arch]
    have = cpu_flags() if flags is None else flags
    return [f for f in v.needs if f not in have]


def can_run(v: Variant) -> bool:
    return not missing(v)


def runnable() -> list[Variant]:
    """This architecture's variants this CPU can run, best first."""
    return [v for v in for_arch() if can_run(v)]


def best() -> Variant:
    found = runnable()
    if not found:
        raise VariantError(f"no kernel variant for this CPU ({arch()})")
    return found[0]


def chosen() -> Variant:
    """The variant this process runs: ``OPSCOPE_CPU_VARIANT`` when set (refused where the CPU
    cannot run it), else the best this CPU can run."""
    name = os.environ.get(ENV, "").strip()
    if not name:
        return best()
    v = by_name(name)
    lack = missing(v)
    if lack:
        raise VariantError(f"{ENV}={name}: this CPU cannot run it (lacks {' '.join(lack)})")
    return v


def reason(v: Variant) -> str:
    """Why ``v`` runs here, as one line: "avx512-vnni: CPU has avx512f avx512bw ..."."""
    forced = os.environ.get(ENV, "").strip() == v.name
    why = (
        f"{ENV}={v.name}"
        if forced
        else (f"CPU has {' '.join(v.needs)}" if v.needs else "no SIMD level above the baseline")
    )
    return f"{v.name}: {why} ({v.summary})"
