"""The CPU kernel variants: the choice per CPU, the refusal of an override the CPU cannot run, and
every variant this host can execute checked against the same independent references.

The reference tests (tests/engine/fastpath/test_kernels_types.py: gguf.quants.dequantize, float64 numpy, the
plain-torch model, llama.cpp's requantized files; tests/engine/fastpath/test_fastpath_q4_0.py; the prefill
GEMMs of tests/engine/fastpath/test_prefill.py; the decode step's attention over many keys) run once per
variant in a child process with OPSCOPE_CPU_VARIANT set (one variant per process: each registers
the same torch operators). A variant this CPU cannot run is skipped with what it lacks."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from opscope.engine.fastpath.kernels import variants

REPO = Path(__file__).resolve().parents[3]
EPYC_7B13 = frozenset("fpu sse sse2 ssse3 sse4_1 sse4_2 avx avx2 fma f16c bmi1 bmi2 abm movbe popcnt sha_ni".split())
CASCADE_LAKE = EPYC_7B13 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx512_vnni"}


def _best_for(flags: frozenset[str], arch: str = "x86_64") -> str:
    return next(v.name for v in variants.for_arch(arch) if not [f for f in v.needs if f not in flags])


def test_each_cpu_gets_the_best_variant_it_can_run():
    assert _best_for(CASCADE_LAKE) == "avx512-vnni"
    assert _best_for(CASCADE_LAKE - {"avx512_vnni"}) == "avx512"
    assert _best_for(EPYC_7B13) == "avx2"  # the AVX2-only AMD hosts
    assert _best_for(EPYC_7B13 | {"avx_vnni"}) == "avx2-vnni"  # Alder Lake and later
    assert _best_for(CASCADE_LAKE | {"avx_vnni"}) == "avx512-vnni"  # Sapphire Rapids: the wider one
    assert _best_for(EPYC_7B13 - {"f16c"}) == "baseline"  # AVX2 without F16C: not the AVX2 variant
    assert _best_for(frozenset()) == "baseline"
    # /proc/cpuinfo's Features of an ARMv8.0 core (Cortex-A72), a Neoverse N1 and a Neoverse V1
    a72 = frozenset("fp asimd evtstrm aes pmull sha1 sha2 crc32 cpuid".split())
    n1 = a72 | {"atomics", "fphp", "asimdhp", "asimdrdm", "lrcpc", "dcpop", "asimddp"}
    assert _best_for(a72, "aarch64") == "neon"
    assert _best_for(n1, "aarch64") == "neon-dotprod"
    assert _best_for(n1 | {"sve", "i8mm", "bf16"}, "aarch64") == "neon-i8mm"


def test_a_feature_counts_only_where_neither_the_os_nor_cpuid_denies_it():
    cascade = {f: f in CASCADE_LAKE for f in ("avx2", "fma", "f16c", "bmi1", "bmi2", "avx512f", "avx512_vnni")}
    rome = {**cascade, "avx512f": False, "avx512_vnni": False}  # an AVX2 CPU model under an emulator
    # Linux: the kernel's list less what CPUID denies; movbe (not in cpuinfo's list) is kept
    assert variants.merge_flags(CASCADE_LAKE, cascade) == CASCADE_LAKE
    assert _best_for(variants.merge_flags(CASCADE_LAKE, rome)) == "avx2"
    assert "avx512f" not in variants.merge_flags(CASCADE_LAKE, rome)
    # a kernel that hides AVX-512 (disabled state) wins over CPUID
    assert _best_for(variants.merge_flags(EPYC_7B13, cascade)) == "avx2"
    # macOS/Windows on x86: CPUID alone (an Intel Mac gets the AVX2 kernels, not the baseline)
    assert _best_for(variants.merge_flags(None, {**rome, "avx": True, "abm": True})) == "avx2"
    assert _best_for(variants.merge_flags(None, cascade)) == "baseline"  # what CPUID does not list is not assumed (avx)
    # torch before 2.11 (no torch.cpu.get_capabilities): the kernel's list alone
    assert variants.merge_flags(EPYC_7B13, None) == EPYC_7B13
    assert variants.merge_flags(None, None) == frozenset()


def test_cpuid_names_are_proc_cpuinfo_names():
    caps = variants._cpuid_flags()
    if caps is None:
        pytest.skip("torch before 2.11 has no torch.cpu.get_capabilities")
    proc = variants._proc_flags()
    if proc is None:
        pytest.skip("no /proc/cpuinfo here")
    # every feature a variant needs that CPUID knows is spelt as the kernel spells it, and agrees here
    for v in variants.for_arch():
        for f in v.needs:
            if f in caps:
                assert caps[f] == (f in proc), (v.name, f)
    assert any(f in caps for v in variants.for_arch() for f in v.needs)


@pytest.mark.skipif(
    variants.arch() != "x86_64" or sys.platform != "linux", reason="x86-64 Linux (qemu-user's CPU models)"
)
def test_an_avx2_only_cpu_gets_the_avx2_kernels(tmp_path):
    """The whole choice on an emulated Zen 2 EPYC (AVX2, FMA, F16C; no AVX-512, which QEMU's TCG
    cannot run either): its CPUID, not the host's /proc/cpuinfo that qemu-user shows it, decides;
    the library comes from prebuilt/ with no compiler on PATH (make cpu-models-check runs the ops
    and a generation there too)."""
    qemu = shutil.which("qemu-x86_64")
    if qemu is None:
        pytest.skip("no qemu-x86_64: apt-get install qemu-user")
    env = {"HOME": str(tmp_path), "PATH": str(tmp_path), "OPSCOPE_KERNEL_CACHE": str(tmp_path / "kc")}
    out = subprocess.run(
        [qemu, "-cpu", "EPYC-Rome", sys.executable, "-m", "opscope", "fastpath"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert lines[0] == (
        "variant avx2: CPU has avx avx2 fma f16c bmi1 bmi2 abm movbe (AVX2+FMA+F16C kernels (vec.h traits))"
    )
    assert lines[1].startswith("library prebuilt: ") and lines[1].endswith(".so"), lines[1]
    assert "avx512-vnni (lacks avx512f avx512bw avx512cd avx512dq avx512vl avx512_vnni)" in lines[-1], lines[-1]


def test_this_process_runs_the_variant_its_cpu_supports():
    v = variants.chosen()
    assert variants.can_run(v)
    if not os.environ.get(variants.ENV):
        assert v == variants.best()
        assert variants.reason(v).startswith(f"{v.name}: CPU has" if v.needs else f"{v.name}: no SIMD")


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "opscope", *args], capture_output=True, text=True, timeout=120, env={**os.environ, **env}
    )


def test_fastpath_names_the_variant_and_why():
    out = _cli("fastpath")
    assert out.returncode == 0, out.stderr
    first = out.stdout.splitlines()[0]
    assert first.startswith(f"variant {variants.chosen().name}: "), first


@pytest.mark.parametrize("int8", [True, False])
def test_fastpath_says_whether_the_variant_has_int8_kernels(int8):
    v = next((v for v in variants.for_arch() if variants.can_run(v) and v.int8 == int8), None)
    if v is None:
        pytest.skip(f"this CPU runs no variant with int8={int8}")
    out = _cli("fastpath", **{variants.ENV: v.name})
    assert out.returncode == 0, out.stderr
    from opscope.engine.fastpath.kernels import native_bf16

    tail = "int8 kernels for every quantized type" if int8 else "no int8 kernels here, so it runs float32"
    bf16 = "bfloat16 (native on this CPU)" if native_bf16() else ""
    if int8:  # every variant with int8 kernels has the int8 prefill GEMM; AVX2's maddubs not for 8-bit quants
        rest = ["Q8_0", "IQ4_NL", "IQ4_XS"] if v.name == "avx2" else []
        tail += (
            f"; prefill GEMMs in int8, in {bf16 or 'float32'} for {', '.join(rest + ['F16'])} and BF16"
            if rest or bf16
            else "; prefill GEMMs in int8 for every quantized type"
        )
    elif bf16:
        tail += f"; prefill GEMMs in {bf16}"
    assert out.stdout.splitlines()[2] == (
        f"activations float32, exact (default); activations=q8 (llama.cpp's int8 scheme): {tail}"
    )


def test_an_override_the_cpu_cannot_run_is_refused_in_one_line():
    foreign = next(v for v in variants.VARIANTS if not variants.can_run(v))  # another arch at least
    out = _cli("fastpath", **{variants.ENV: foreign.name})
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"opscope: error: {variants.ENV}={foreign.name}: this CPU cannot run it (lacks {' '.join(variants.missing(foreign))})"
    ]


def test_an_unknown_variant_is_refused_in_one_line():
    out = _cli("fastpath", **{variants.ENV: "avx1024"})
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert "no such kernel variant" in out.stderr


REFERENCE_TESTS = [
    "tests/engine/fastpath/test_kernels_types.py",
    "tests/engine/fastpath/test_fastpath_q4_0.py",
    "tests/engine/fastpath/test_prefill.py",
    "tests/engine/fastpath/test_fastpath_model.py::test_fused_decode_attention_over_many_keys_matches_reference",
]


@pytest.fixture(scope="module")
def requantized_dir(tmp_path_factory) -> Path:
    """One folder for llama-quantize's files, shared by every variant's run (the files do not
    depend on the variant that reads them)."""
    return tmp_path_factory.mktemp("requantized")


@pytest.mark.parametrize("name", [v.name for v in variants.VARIANTS])
def test_every_variant_matches_the_references(name, requantized_dir, default_model_2_layers):
    v = variants.by_name(name)
    lack = variants.missing(v)
    if lack:
        pytest.skip(f"this CPU cannot run {name}: lacks {' '.join(lack)}")
    if v == variants.chosen() and not os.environ.get(variants.ENV):
        # This pytest process runs the same files with the same kernels (no override set).
        pytest.skip(f"{name} is this process's own variant: the suite runs {', '.join(REFERENCE_TESTS)} with it")
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *REFERENCE_TESTS],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=1200,
        env={
            **os.environ,
            variants.ENV: name,
            "OPSCOPE_TEST_REQUANTIZED_DIR": str(requantized_dir),
            "OPSCOPE_TEST_FIRST_LAYERS_DIR": str(default_model_2_layers.parent),
        },
    )
    tail = out.stdout[-3000:] + out.stderr[-2000:]
    assert out.returncode == 0, tail
    assert " passed" in out.stdout and " failed" not in out.stdout, tail


def test_auto_takes_plain_torch_where_the_kernels_would_be_slower(monkeypatch):
    """The baseline variant (no AVX2) decodes slower than plain torch: "auto" leaves it; an
    explicit fast-path spec still runs it."""
    from opscope.engine.api import fastpath_options

    monkeypatch.setattr(variants, "chosen", lambda: variants.by_name("baseline"))
    assert fastpath_options("auto", "cpu", "float32", None) is None
    assert fastpath_options("activations=f32", "cpu", "float32", None) is not None
    monkeypatch.setattr(variants, "chosen", lambda: variants.by_name("avx2"))
    assert fastpath_options("auto", "cpu", "float32", None) is not None


def test_bf16_is_native_only_where_the_cpu_has_it_and_onednn_is_not_capped_below_it(monkeypatch):
    from opscope.engine.fastpath.kernels import build

    for flags, cap, native in (
        ("fma avx2 avx512f avx512_bf16", None, True),
        ("fma avx2 avx512f avx512_bf16", "AVX2", False),  # an AVX2 CPU stood in for
        ("fma avx2 avx512f avx512_bf16", "avx512_core_bf16", True),
        ("fma avx2 amx_bf16", "AVX512_CORE_VNNI", False),
        ("fma avx2 avx512f avx512_vnni", None, False),
        ("fp asimd asimddp bf16 i8mm", None, True),  # Arm's "Features"
    ):
        monkeypatch.setattr(variants, "cpu_flags", lambda flags=flags: frozenset(flags.split()))
        monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
        if cap is None:
            monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
        else:
            monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
        assert build.native_bf16() == native, (flags, cap)
