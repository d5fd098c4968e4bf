"""Run the cross-built ARM64 kernel library inside a real aarch64 torch, under qemu-user.

    make arm-check         # after `make prebuilt-arm`; = python packaging/arm_check.py

An x86-64 host has no ARM CPU: this starts Debian's aarch64 CPython (its .debs, unpacked into a
sysroot with the cross toolchain's C and C++ libraries) under qemu-aarch64 with torch's aarch64
wheel on its path, imports the prebuilt library from its folder as the loader would, and runs the
matvec and prefill GEMM of every type against references made here (packaging/arm_guest.py); then
the engine itself generates from the embedded model there, which must print the text it prints here.
PyPI's aarch64 torch is a CUDA build: the NVIDIA libraries it names are replaced by empty
libraries with the same names and symbol versions, which load and are never called on a CPU run.
Minutes: importing torch under emulation is slow.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from importlib.metadata import version as installed_version
from pathlib import Path

import cross_kernels as cross
from arm_guest import PROMPT, SPECS, TOKENS
from opscope.engine.core.defaults import default_model_path
from opscope.engine.core.errors import EngineError
from opscope.engine.fastpath.kernels import build, variants

HERE = Path(__file__).resolve().parent
# Debian's pool, then its security updates' pool (point-release fixes live in one or the other).
DEBIAN = ("http://deb.debian.org/debian/pool/main/", "http://deb.debian.org/debian-security/pool/updates/main/")
# Debian 12's aarch64 CPython and what its interpreter and standard library link with (the C and
# C++ runtime come from the cross toolchain's /usr/aarch64-linux-gnu).
DEBS = (
    "p/python3.11/python3.11-minimal_3.11.2-6+deb12u6_arm64.deb",
    "p/python3.11/libpython3.11-minimal_3.11.2-6+deb12u6_arm64.deb",
    "p/python3.11/libpython3.11-stdlib_3.11.2-6+deb12u6_arm64.deb",
    "libf/libffi/libffi8_3.4.4-1_arm64.deb",
    "z/zlib/zlib1g_1.2.13.dfsg-1_arm64.deb",
    "e/expat/libexpat1_2.5.0-1+deb12u1_arm64.deb",
    "b/bzip2/libbz2-1.0_1.0.8-5+b1_arm64.deb",
    "x/xz-utils/liblzma5_5.4.1-1_arm64.deb",
    "u/util-linux/libuuid1_2.38.1-5+deb12u3_arm64.deb",
    "libx/libxcrypt/libcrypt1_4.4.33-2_arm64.deb",
)
CROSS_LIBS = Path("/usr/aarch64-linux-gnu/lib")
# torch's pure-Python dependencies, copied from this environment (a compiled speed-up inside one,
# e.g. markupsafe's, fails to import on aarch64 and the package falls back to Python).
PURE = (
    "typing_extensions",
    "filelock",
    "sympy",
    "mpmath",
    "networkx",
    "jinja2",
    "markupsafe",
    "fsspec",
    "platformdirs",
)
# the engine's own pure-Python dependencies for the generation (tokenizers, compiled, comes as its
# aarch64 wheel: ENGINE_WHEELS)
ENGINE_PURE = ("gguf", "yaml", "tqdm")
ENGINE_WHEELS = ("tokenizers",)
TYPES = ("F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
TYPES += ("IQ4_NL", "IQ4_XS")
# (type, layout) with int8-activation kernels in every aarch64 variant: every quantized type, but
# Q8_0 only repacked (the loader's layout for it), as on x86
Q8_CASES = {(t, layout) for t in TYPES if t not in ("F16", "BF16") for layout in ("raw", "auto")} - {("Q8_0", "raw")}


def sysroot(cache: Path) -> Path:
    root = cache / "sysroot"
    if not (root / "usr" / "bin" / "python3.11").is_file():
        tmp = cache / "sysroot.tmp"
        unpack_debs(DEBS, cache / "debs", tmp)
        shutil.copytree(CROSS_LIBS, tmp / "lib" / "aarch64-linux-gnu", dirs_exist_ok=True, symlinks=True)
        (tmp / "lib" / "ld-linux-aarch64.so.1").symlink_to("aarch64-linux-gnu/ld-linux-aarch64.so.1")
        tmp.replace(root)
    fake_arm_cpu(root, os.cpu_count() or 1)  # each run: a cached sysroot may describe an older CPU
    return root


def unpack_debs(paths: tuple[str, ...], debs: Path, dest: Path) -> None:
    """Debian's packages at ``paths`` (in its pool) downloaded once into ``debs`` and unpacked into a
    new ``dest``."""
    debs.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(dest, ignore_errors=True)
    for path in paths:
        deb = debs / path.rsplit("/", 1)[1]
        error = ""
        for base in DEBIAN if not deb.is_file() else ():
            try:
                urllib.request.urlretrieve(base + path, deb)
                break
            except OSError as e:
                error = f"downloading {base + path} failed ({e}): is deb.debian.org reachable?"
        if not deb.is_file():
            raise cross.CrossError(error)
        subprocess.run(["dpkg-deb", "-x", str(deb), str(dest)], check=True)


def fake_arm_cpu(root: Path, cpus: int) -> None:
    """qemu-user shows the guest the host's /proc/cpuinfo (x86 text) unless the sysroot has one:
    torch's cpuinfo then finds no ARM core and crashes in `import torch`; oneDNN's xbyak reads each
    core's MIDR from sysfs. A Neoverse N1 (ARMv8.2 with dotprod) that also lists i8mm, as qemu's
    default CPU (max) has it and reports it in the hardware capabilities torch's cpuinfo reads: the
    loader then picks neon-i8mm on its own. A real N1 has no i8mm; nothing here reads the core's
    model beyond its features."""
    core = (
        "processor\t: {i}\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp "
        "asimdhp cpuid asimdrdm lrcpc dcpop asimddp i8mm\nCPU implementer\t: 0x41\nCPU architecture: 8\n"
        "CPU variant\t: 0x3\nCPU part\t: 0xd0c\nCPU revision\t: 1\n\n"
    )
    (root / "proc").mkdir(parents=True, exist_ok=True)
    (root / "proc" / "cpuinfo").write_text("".join(core.format(i=i) for i in range(cpus)))
    for i in range(cpus):
        ident = root / "sys" / "devices" / "system" / "cpu" / f"cpu{i}" / "regs" / "identification"
        ident.mkdir(parents=True, exist_ok=True)
        (ident / "midr_el1").write_text("0x00000000413fd0c1\n")


def site(cache: Path, version: str) -> Path:
    """torch's whole aarch64 wheel unpacked, numpy's (the engine's kernel loader imports it), the
    pure-Python dependencies beside them, and this checkout as the package ``opscope``."""
    dest = cross.unpack(
        cross.torch_wheel(cache, version), cache / f"site-torch{version}-{sys.implementation.cache_tag}"
    )
    import numpy

    py = f"{sys.version_info.major}{sys.version_info.minor}"
    if not (dest / "numpy").is_dir():
        cross.merge_wheel(
            cross.download_wheel(cache, "numpy", numpy.__version__, cross.ARCH, (cross.PLATFORM,), py), dest
        )
    for name in ENGINE_WHEELS:  # this environment's release, as its aarch64 abi3 wheel
        if not (dest / name).is_dir():
            platforms = (cross.PLATFORM, "manylinux2014_aarch64")
            wheel = cross.download_wheel(cache, name, installed_version(name), cross.ARCH, platforms, py, abi3=True)
            cross.merge_wheel(wheel, dest)
    copy_pure(dest)
    return dest


def copy_pure(dest: Path) -> None:
    """This checkout as the package ``opscope`` in ``dest`` and torch's pure-Python dependencies
    copied from this environment."""
    import importlib.util

    link = dest / "opscope"
    if not link.exists():
        link.symlink_to(Path(build.__file__).resolve().parents[3])
    for name in PURE + ENGINE_PURE:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            continue
        src = Path(spec.origin)
        if src.name == "__init__.py":
            shutil.copytree(src.parent, dest / name, dirs_exist_ok=True)
        else:
            shutil.copy2(src, dest / src.name)


def _needed(lib: Path, readelf: str = cross.READELF) -> list[str]:
    out = subprocess.run([readelf, "-d", str(lib)], capture_output=True, text=True).stdout
    return re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", out)


def _versions_needed(lib: Path, readelf: str = cross.READELF) -> dict[str, set[str]]:
    """{library file: the symbol version names ``lib`` asks of it} (readelf -V's verneed section)."""
    out = subprocess.run([readelf, "-V", "-W", str(lib)], capture_output=True, text=True).stdout
    found: dict[str, set[str]] = {}
    current = None
    for line in out.splitlines():
        m = re.search(r"File: (\S+)", line)
        if m:
            current = m.group(1)
            continue
        m = re.search(r"Name: (\S+)\s+Flags", line)
        if m and current:
            found.setdefault(current, set()).add(m.group(1))
    return found


_SYM = re.compile(r"^\s*\d+:\s+\S+\s+\d+\s+(\w+)\s+(\w+)\s+\w+\s+(\S+)\s+([^@\s]+)(?:@+(\S+))?")


def _symbols(lib: Path, readelf: str = cross.READELF) -> tuple[set[str], list[tuple[str, str | None, str]]]:
    """(names ``lib`` defines, [(name, version, type)] of the global symbols it needs from others)."""
    out = subprocess.run([readelf, "--dyn-syms", "-W", str(lib)], capture_output=True, text=True).stdout
    defined, needed = set(), []
    for line in out.splitlines():
        m = _SYM.match(line)
        if not m:
            continue
        kind, bind, ndx, name, version = m.groups()
        if ndx != "UND":
            defined.add(name)
        elif bind == "GLOBAL" and name:
            needed.append((name, version, kind))
    return defined, needed


def _stub_source(symbols: list[tuple[str, str]], arch: str = cross.ARCH) -> str:
    """Assembly for ``arch`` defining each (name, type): functions return 100 (cudaErrorNoDevice, and
    an error to any other C API), objects are zeroed bytes."""
    ret = ["mov w0, #100", "ret"] if arch == "aarch64" else ["movl $100, %eax", "ret"]
    lines = []
    for name, kind in symbols:
        if kind == "OBJECT":
            lines += [
                ".data",
                f".globl {name}",
                f".type {name}, %object",
                f".size {name}, 256",
                f"{name}:",
                ".zero 256",
            ]
        else:
            lines += [".text", f".globl {name}", f".type {name}, %function", f"{name}:", *ret]
    return "\n".join(lines) + "\n"


def stubs(site_dir: Path, root: Path, cache: Path, arch: str = cross.ARCH, python: str = "python3.11") -> Path:
    """Libraries for the NVIDIA ones torch's libraries name but the wheel does not hold: each with
    its soname, the symbol versions asked of it and every symbol asked of it (CPython loads
    extensions with RTLD_NOW: an unresolved function fails the import, not just its call). For
    ``arch``'s torch in ``site_dir`` and the sysroot ``root`` (its C libraries and ``python``)."""
    readelf = cross.TARGETS[arch].readelf
    out = cache / f"stubs-{site_dir.name}"  # per torch: a run for one leaves the other's
    libs = sorted((site_dir / "torch" / "lib").glob("*.so*")) + sorted((site_dir / "torch").glob("_C*.so"))
    system = [p for d in ("lib", "usr/lib") for p in (root / d / f"{arch}-linux-gnu").glob("*.so*") if p.is_file()]
    # Made once for these libraries: reading every symbol table again costs seconds per run.
    key = hashlib.sha256("".join(f"{p}:{p.stat().st_size}\n" for p in libs + system).encode()).hexdigest()
    if (out / "KEY").is_file() and (out / "KEY").read_text() == key:
        return out
    have = {p.name for p in libs + system}
    missing: dict[str, set[str]] = {}
    owner: dict[str, str] = {}  # version name -> the missing library that defines it
    defined: set[str] = set()
    needed: list[tuple[str, str | None, str]] = []
    for lib in libs + system + [root / "usr" / "bin" / python]:
        names, wants = _symbols(lib, readelf)
        defined |= names
        if lib in libs:
            needed += wants
            versions = _versions_needed(lib, readelf)
            for name in _needed(lib, readelf):
                if name not in have:
                    missing.setdefault(name, set()).update(versions.get(name, ()))
                    owner.update({v: name for v in versions.get(name, ())})
    if not missing:
        return out
    per_lib: dict[str, dict[str, tuple[str, str | None]]] = {name: {} for name in missing}
    first = sorted(missing)[0]  # unversioned symbols: any loaded library may define them
    for name, version, kind in needed:
        if name not in defined and (version is None or version in owner):
            per_lib[owner.get(version, first) if version else first][name] = (kind, version)
    out.mkdir(parents=True, exist_ok=True)
    cc = (shutil.which("aarch64-linux-gnu-gcc") or "aarch64-linux-gnu-g++") if arch == "aarch64" else "gcc"
    for lib_name, versions in sorted(missing.items()):
        syms = per_lib[lib_name]
        with tempfile.TemporaryDirectory() as tmp:
            src, script = Path(tmp) / "stub.S", Path(tmp) / "stub.map"
            src.write_text(_stub_source([(n, k) for n, (k, _) in sorted(syms.items())], arch))
            nodes = []
            for v in sorted(versions):
                names = "".join(f"{n}; " for n, (_, ver) in sorted(syms.items()) if ver == v)
                nodes.append(f"{v} {{ global: {names}}};\n" if names else f"{v} {{ }};\n")
            script.write_text("".join(nodes))
            args = [cc, "-shared", "-fPIC", "-nostdlib", "-Wl,-z,noexecstack", f"-Wl,-soname,{lib_name}", str(src)]
            args += ["-o", str(out / lib_name)]  # noexecstack: glibc 2.41 refuses to load a library asking for one
            subprocess.run(args + ([f"-Wl,--version-script,{script}"] if versions else []), check=True)
    (out / "KEY").write_text(key)
    return out


def make_inputs(path: Path) -> None:
    """Per type: random blocks in each layout, one row and 64 rows of activations, and the float64
    products with ggml's own dequantized weights; for the quantized types also the one-row product
    with int8 activations (act_mode 1) and the int8 prefill GEMM of 67 rows, whose reference is the
    int8-rounded x times those weights."""
    import gguf
    import numpy as np
    import torch
    from opscope.engine.fastpath.kernels.packing import QTYPES, RAW_TYPES, pack, random_blocks
    from opscope.engine.testing import q8

    rng = np.random.default_rng(0)
    cases = []
    for t in TYPES:
        n, k = 37, 256 * 3 if RAW_TYPES[t][1] == 256 else 32 * 7
        raw = random_blocks(t, n, k, rng)
        dense = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[t]).reshape(n, k).astype(np.float64)
        for layout in ("raw",) + (("auto",) if t in QTYPES or t == "Q4_0" else ()):
            w = pack(t, raw, (n, k), layout=layout)
            checks = []
            # 67 tokens: the int8 GEMM's tiles of 4 and a last 3 (i8mm pairs tokens: one paired with itself)
            q8_ops = (("qlinear_q8", 1), ("qgemm_q8", 67)) if (t, layout) in Q8_CASES else ()
            for op, rows in (("qlinear", 1), ("qgemm", 64), *q8_ops):
                x = torch.from_numpy(rng.standard_normal((rows, k)).astype(np.float32))
                xd = x.double().numpy()
                # int8 activations per block (32 or 256) in the matvec, per 32 in the int8 prefill GEMM
                block = {"qlinear_q8": RAW_TYPES[t][1], "qgemm_q8": 32}.get(op)
                xr = q8.dequantized(xd, block) if block else xd
                ref, bound = xr @ dense.T, np.abs(xd) @ np.abs(dense).T
                checks.append((op, x, torch.from_numpy(ref), torch.from_numpy(bound)))
            weight = {"qs": w.qs, "d": w.d, "m": w.m, "qtype": w.qtype}
            cases.append({"type": t, "layout": layout, "weight": weight, "checks": checks})
    torch.save(cases, path)


def native_generation(model: str, spec: str) -> dict:
    """The greedy continuation of arm_guest.PROMPT here (`opscope generate`, this CPU's variant)."""
    cmd = [sys.executable, "-m", "opscope", "generate", "--json", "--threads", "2", "--fastpath", spec]
    with tempfile.TemporaryDirectory(prefix="opscope-arm-check-") as tmp:
        cmd += ["--db", str(Path(tmp) / "runs.sqlite"), "--max-tokens", str(TOKENS), PROMPT]
        return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)


def guest(cmd: list[str], env: dict[str, str]) -> tuple[int, dict[str, dict]]:
    """Run arm_guest.py under qemu, its lines passed through as they come; (exit status, its
    ``generate:`` results by fast-path spec)."""
    result = {}
    with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True) as p:
        assert p.stdout is not None
        for line in p.stdout:
            print(line, end="", flush=True)
            if line.startswith("generate: "):
                g = json.loads(line.removeprefix("generate: "))
                result[g["spec"]] = g
    return p.returncode, result


def prebuilt(version: str, variant: str) -> tuple[Path, str]:
    folder = build.prebuilt_root() / cross.folder_name(version, cross.ARM64)
    try:
        entry = json.loads((folder / "manifest.json").read_text())[variant]
    except (OSError, ValueError, KeyError):
        raise cross.CrossError(
            f"no ARM64 {variant} kernel library in {folder}: run `make prebuilt-arm` first"
        ) from None
    return folder / entry["file"], entry["module"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", default=str(build.cache_root().parent / "cross"), help="downloads and sysroot")
    ap.add_argument("--torch", metavar="VERSION", help="the torch release whose libraries to run (default: this one's)")
    a = ap.parse_args(argv)
    cache = Path(a.cache)
    try:
        if shutil.which("qemu-aarch64") is None:
            raise cross.CrossError("qemu-aarch64 not found: apt-get install qemu-user")
        version = a.torch or cross.torch_version()
        libraries = {v.name: prebuilt(version, v.name) for v in variants.for_arch(cross.ARCH)}
        root = sysroot(cache)
        site_dir = site(cache, version)
        stub_dir = stubs(site_dir, root, cache)
        inputs = cache / "arm_check_inputs.pt"
        make_inputs(inputs)
        model = str(default_model_path())
        here = {spec: native_generation(model, spec) for spec in SPECS}
    except (cross.CrossError, subprocess.CalledProcessError, EngineError) as e:
        print(f"arm_check: {e}", file=sys.stderr)
        return 2
    for spec, g in here.items():
        print(f"here ({g['cpu_kernels']} kernels, fast path {spec}): {g['text']!r}", flush=True)
    libpath = f"{stub_dir}:/lib/aarch64-linux-gnu:/usr/lib/aarch64-linux-gnu"
    failed = []
    for name, (library, module) in libraries.items():
        # An empty kernel cache: the library can only come from prebuilt/. The first variant is the
        # one the loader picks on its own (the guest's CPU has dotprod and i8mm); the others are asked for.
        forced = "" if name == variants.for_arch(cross.ARCH)[0].name else name
        guest_env = (
            f"LD_LIBRARY_PATH={libpath},PYTHONPATH={site_dir},OPSCOPE_KERNEL_CACHE={cache / 'empty-kernel-cache'}"
        )
        guest_env += f",{variants.ENV}={forced}"
        env = os.environ | {"QEMU_LD_PREFIX": str(root), "QEMU_SET_ENV": guest_env}
        cmd = ["qemu-aarch64", str(root / "usr" / "bin" / "python3.11"), str(HERE / "arm_guest.py")]
        print(f"library: {library} ({module})", flush=True)
        rc, there = guest(cmd + [str(inputs), name, model], env)
        if rc != 0:
            failed.append(name)
        for spec in SPECS:
            g = there.get(spec, {})
            if (g.get("text"), g.get("cpu_kernels"), g.get("decode_step")) != (here[spec]["text"], name, "FusedStep"):
                print(f"FAILED: the generation ({spec}) is not this host's text by {name}'s fused step: {g}")
                failed.append(f"{name} (generate, {spec})")
    if failed:
        print(f"arm_check: {', '.join(failed)} failed", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
