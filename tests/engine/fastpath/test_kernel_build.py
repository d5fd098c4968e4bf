"""The kernel build (engine/fastpath/kernels/build.py, toolchain.py) through its own code path with
one-function sources: the library the loader asked for (entry.cpp names it) calling from the torch
half into the variant's code, the torch half compiled once and shared by every variant, what a
killed build leaves behind, and a library whose own function is missing refused at link time, not
at load. The real sources take half a minute to compile; these compile in a second (no headers)."""

from __future__ import annotations

import shutil

import pytest
from opscope.engine.fastpath.kernels import KernelBuildError, build, variants

# The torch half's stand-in: a function the library exports, calling into the variant's unit (the
# real half registers torch operators that do).
_HALF = r"""
int opscope_variant_bits();
extern "C" int opscope_answer() { return 40 + opscope_variant_bits(); }
"""
_VARIANT = "int opscope_variant_bits() { return 2; }\n"


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler to build with")
    csrc = tmp_path / "csrc"
    csrc.mkdir()
    shutil.copy(build.CSRC / "entry.cpp", csrc / "entry.cpp")
    (csrc / "half.cpp").write_text(_HALF)
    (csrc / "bits.cpp").write_text(_VARIANT)
    monkeypatch.setattr(build, "CSRC", csrc)
    monkeypatch.setattr(build, "VARIANT_SOURCES", ("bits.cpp", "entry.cpp"))
    monkeypatch.setattr(build, "TORCH_HALF", "half.cpp")
    monkeypatch.setattr(build, "SOURCES", ("bits.cpp", "entry.cpp", "half.cpp"))
    monkeypatch.setattr(build, "_HEADERS", ())
    monkeypatch.setenv("OPSCOPE_KERNEL_CACHE", str(tmp_path / "kernels"))
    monkeypatch.setenv("OPSCOPE_KERNEL_PREBUILT", str(tmp_path / "none"))  # no prebuilt fits: it builds
    return tmp_path / "kernels"


def _halves(cache):
    return sorted(cache.glob("opscope_torch_half_*/half.o"))


def _answer(kernels) -> int:
    return kernels.library.opscope_answer()  # the half's function, calling the variant's


def test_a_variant_loads_as_the_library_asked_for_through_the_shared_half(tiny):
    name = build.module_name()
    kernels = build._load_kernels.__wrapped__()  # the uncached load: this process's own kernels stay loaded
    assert _answer(kernels) == 42 and kernels.__name__ == name
    assert kernels.__file__ == str(tiny / name / f"{name}.so")
    assert len(_halves(tiny)) == 1


def test_the_torch_half_is_compiled_once_for_every_variant(tiny, tmp_path):
    todo = [v for v in variants.for_arch()][:3]
    out = build.prebuild(tmp_path / "prebuilt", [v.name for v in todo])
    assert [line.split(":", 1)[0] for line in out] == [v.name for v in todo]
    assert len(_halves(tiny)) == 1
    libs = [tiny / build.module_name(v) for v in todo]
    assert all(len(list(d.glob("*.so"))) == 1 for d in libs)
    for v in todo:  # each in the manifest, found again as the prebuilt library
        assert build.prebuilt_entry(v) is None  # OPSCOPE_KERNEL_PREBUILT points elsewhere
    assert sorted(p.name for p in (tmp_path / "prebuilt" / build.abi_tag()).iterdir()) == sorted(
        [f"{build.module_name(v)}.so" for v in todo] + ["manifest.json"]
    )


def test_what_a_killed_build_leaves_does_not_stop_the_next(tiny):
    name = build.module_name()
    half = build.half_unit(build.toolchain.host(), variants.arch(), tiny).obj
    half.parent.mkdir(parents=True)
    (half.parent / ".half.o.4242.1.tmp").write_bytes(b"\x7fELF half-written")  # a compile cut short
    (tiny / name).mkdir(parents=True)
    (tiny / name / ".bits.o.4242.1.tmp").write_bytes(b"")
    (tiny / f"{name}.flock").write_text("")  # the lock file of a build that died holding it
    assert _answer(build._load_kernels.__wrapped__()) == 42


def test_a_library_missing_one_of_its_own_functions_is_refused_at_link(tiny):
    (build.CSRC / "half.cpp").write_text(
        _HALF.replace("int opscope_variant_bits();", "namespace opscope { int bits(); }").replace(
            "opscope_variant_bits()", "opscope::bits()"
        )
    )
    with pytest.raises(KernelBuildError, match=r"linking .*: 1 of its functions undefined, e\.g\. opscope::bits\(\)"):
        build._load_kernels.__wrapped__()


def _stale(cache, prefix: str, n: int, age_s: float = 3600.0) -> list:
    """n entries of ``prefix`` from older builds, the first the most recently used."""
    import os
    import time

    out = []
    for i in range(n):
        d = cache / f"{prefix}{i + 1:016x}"
        d.mkdir(parents=True)
        (d / "old.so").write_bytes(b"\x7fELF old")
        (cache / f"{d.name}.flock").write_text("")
        t = time.time() - age_s * (i + 1)
        os.utime(d, (t, t))
        out.append(d)
    return out


def test_a_build_removes_the_old_builds_it_replaces_keeping_the_recently_used(tiny):
    name = build.module_name()
    prefix = name[:-16]
    old = _stale(tiny, prefix, 4)
    half = build.half_unit(build.toolchain.host(), variants.arch(), tiny).obj.parent
    old_halves = _stale(tiny, half.name[:-16], 3)
    other = _stale(tiny, f"{prefix}vnni_", 4)  # a longer variant name with the same start: not a sibling
    assert _answer(build._load_kernels.__wrapped__()) == 42
    kept = sorted(p.name for p in tiny.iterdir() if p.is_dir())
    assert kept == sorted([name, half.name, *(d.name for d in old[:2] + old_halves[:2] + other)])
    assert not any(d.exists() or d.with_name(f"{d.name}.flock").exists() for d in old[2:] + old_halves[2:])


def test_an_old_build_another_process_is_building_is_left(tiny):
    import subprocess
    import sys

    old = _stale(tiny, build.module_name()[:-16], 4)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl,sys,time; f=open(sys.argv[1],'a+b'); fcntl.flock(f, fcntl.LOCK_EX); "
         "print('locked', flush=True); time.sleep(60)", str(old[3]) + ".flock"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "locked"
        build._load_kernels.__wrapped__()
    finally:
        holder.kill()
        holder.wait()
    assert [d.exists() for d in old] == [True, True, False, True]


def test_loading_a_cached_build_marks_it_used(tiny):
    import os

    name = build.module_name()
    build._load_kernels.__wrapped__()
    os.utime(tiny / name, (1, 1))
    build._load_kernels.__wrapped__()
    assert (tiny / name).stat().st_mtime > 1e9


def test_installing_a_variant_replaces_its_older_library_only(tiny, tmp_path):
    v = variants.by_name("avx2") if variants.arch() == "x86_64" else variants.for_arch()[0]
    folder = tmp_path / "prebuilt" / build.abi_tag()
    folder.mkdir(parents=True)
    suffix = build.SUFFIX
    name = build.module_name(v)
    older = folder / f"{name[:-16]}{'0' * 16}{suffix}"
    longer = folder / f"{name[:-16]}vnni_{'1' * 16}{suffix}"  # another variant whose name starts the same
    for f in (older, longer):
        f.write_bytes(b"\x7fELF old")
    build.prebuild(tmp_path / "prebuilt", [v.name])
    assert (folder / f"{name}{suffix}").is_file() and longer.is_file() and not older.exists()


def test_without_a_library_for_this_torch_the_origin_names_the_torches_that_have_one(tmp_path, monkeypatch):
    """A torch extension loads only into the torch it was compiled against: where the wheel carries
    libraries for other torch releases only, `opscope fastpath` says which (a folder without a
    manifest, another architecture's or one of the older per-Python form is not one)."""
    root = tmp_path / "prebuilt"
    other_arch = "aarch64" if variants.arch() != "aarch64" else "x86_64"
    for folder, manifest in (("torch9.9", True), ("torch1.0", True), ("torch8.8", False)):
        (root / f"{folder}-{variants.arch()}").mkdir(parents=True)
        if manifest:
            (root / f"{folder}-{variants.arch()}" / "manifest.json").write_text("{}")
    for stray in (f"torch7.7-{other_arch}", f"torch6.6.6-cpython-311-{variants.arch()}"):  # the older form too
        (root / stray).mkdir()
        (root / stray / "manifest.json").write_text("{}")
    monkeypatch.setenv("OPSCOPE_KERNEL_PREBUILT", str(root))
    monkeypatch.setenv("OPSCOPE_KERNEL_CACHE", str(tmp_path / "cache"))
    origin = build.library_origin(variants.for_arch()[-1])
    assert origin.startswith("not built yet: compiled at first use into "), origin
    assert origin.endswith("(a few minutes, needs a C++ compiler); prebuilt here only for torch1.0, torch9.9"), origin


def test_a_mac_compiles_openmp_through_clangs_front_end_and_finds_torch_by_rpath(tmp_path):
    from opscope.engine.fastpath.kernels import toolchain

    inc, lib = tmp_path / "include", tmp_path / "lib"
    inc.mkdir()
    # torch's macOS wheel without omp.h: no OpenMP (at::parallel_for then runs on the caller)
    bare = toolchain.against_torch("c++", [inc], lib, "darwin", "nm", "t", cxx11_abi=False)
    assert bare.platform.openmp == () and "-fopenmp" not in bare.flags
    (inc / "omp.h").write_text("")
    mac = toolchain.against_torch("c++", [inc], lib, "darwin", "nm", "t", cxx11_abi=False)
    assert mac.platform.openmp == ("-Xclang", "-fopenmp")  # Apple's clang driver refuses -fopenmp
    # MKL's weak symbols and libomp's bind to the loaded torch's; torch's @rpath names resolve
    assert mac.libs[-1] == f"-Wl,-rpath,{lib}" and mac.platform.link == ("-undefined", "dynamic_lookup")
    assert mac.platform.nm_undefined == ("-C", "-u")  # Mach-O has no dynamic symbol table for nm -D
    linux = toolchain.against_torch("c++", [inc], lib, "linux", "nm", "t")
    assert linux.platform.openmp == linux.platform.link == ("-fopenmp",)
    assert not any("rpath" in f for f in linux.libs)
