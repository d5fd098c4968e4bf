"""Every common GGUF type: OpScope's pp512/tg128 and peak RSS against llama.cpp's own llama-bench.

    .venv/bin/python benchmarks/gguf_types.py [--types Q4_0,Q4_K_M] [--rounds 3] [--threads 2] [--quick]

1. Files: llama-quantize (``--allow-requantize``) turns the embedded model (SmolLM2-135M Q4_1) into
   every type, cached in ~/.cache/opscope/gguf_types (outside the repo). F16 and BF16 are written by
   llama-quantize straight from the Q4_1 file (its dequantized values, rounded to 16 bits: the same
   weights as the source, nothing lost on the way through another quantized type). On rows of 576 the
   K types fall back per tensor (Q4_K_M: mostly Q5_0), as real small-model downloads do: the table
   lists each file's tensor types.
2. Per type, ``--rounds`` interleaved rounds (the order flips every round): (a) ``llama-bench -p 512
   -n 128 -t T -r 1 -o json`` in its own process, (b) OpScope in a fresh process of its own
   (``--child``): ``engine.api.load`` (the default CPU fast path) and the llm suite's own pp/tg points
   (``engine.bench.suites.llm.pp_point``/``tg_point``, what ``opscope bench llm`` runs), one warm-up
   each as llama-bench does. tg runs with a fixed thread count, like llama-bench's ``-t``: the fast
   path's load-aware decode threads act in ``generate``, not in the tg point. Each process's own peak
   RSS comes from ``os.wait4``; the OpScope child also reports RSS per phase (import torch, first
   matmul, load, pp, tg), and as its marks reset the high-water mark that wait4 reports, its peak is
   the largest of its phases' peaks (wait4's figure also counts its own children, e.g. a compiler).
3. Writes benchmarks/results/gguf_types.{md,json}: per type the median and [min–max] over rounds of
   each figure and of the per-round ratios, the goals (tg ≥ 1.0×, pp ≥ 1.5×, RSS ≤ file + KV + 450 MB),
   and ``uptime`` load before and after. A type the engine refuses shows as "refused: <message>".
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TOOLS = Path(os.environ.get("OPSCOPE_LLAMA_TOOLS", REPO.parent / "shared" / "tools" / "llama.cpp"))
TYPES = (
    "Q4_0",
    "Q4_1",
    "Q5_0",
    "Q5_1",
    "Q8_0",
    "Q2_K",
    "Q3_K_M",
    "Q4_K_M",
    "Q5_K_M",
    "Q6_K",
    "IQ4_NL",
    "IQ4_XS",
    "F16",
    "BF16",
)
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "opscope" / "gguf_types"
RESULTS = REPO / "benchmarks" / "results"
RSS_SLACK_BYTES = 450 * 2**20  # the memory goal: peak RSS <= file + KV cache + 450 MB
GOAL_TG, GOAL_PP = 1.0, 1.5
MiB = 2**20
PEER_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}
# An AVX2 host stood in for on a wider CPU: both sides limited to AVX2, torch's own libraries too
# (ATen's vectorised ops, MKL's sgemm and oneDNN would otherwise run AVX-512 code in prefill).
STAND_IN = {
    "avx2": (
        "haswell",
        {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    ),
}

log = logging.getLogger("gguf_types")


# ---------------------------------------------------------------- files


def quantize(src: Path, kind: str, cache: Path, threads: int) -> Path:
    """``src`` re-quantized to ``kind`` by llama-quantize (cached by name; the source's mtime checked)."""
    out = cache / f"{src.stem.split('.')[0]}.{kind}.gguf"
    if out.is_file() and out.stat().st_mtime >= src.stat().st_mtime:
        return out
    cache.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    argv = [str(TOOLS / "llama-quantize"), "--allow-requantize", str(src), str(tmp), kind, str(threads)]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"llama-quantize {kind} failed: {proc.stderr.strip().splitlines()[-1:]}")
    tmp.rename(out)
    return out


def tensor_types(path: Path) -> dict[str, int]:
    """{ggml type: tensor count} of a GGUF file (what llama-quantize really wrote)."""
    import gguf

    counts: dict[str, int] = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


# ---------------------------------------------------------------- the OpScope child


def _status_kb() -> dict[str, int]:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
            out[key] = int(rest.split()[0])
    return out


class Phases:
    """RSS after each phase and the peak within it (VmHWM, reset through clear_refs between phases)."""

    def __init__(self):
        self.rows: list[dict] = []

    def mark(self, name: str) -> None:
        kb = _status_kb()
        self.rows.append(
            {
                "phase": name,
                "rss_mb": kb["VmRSS"] / 1024,
                "peak_mb": kb["VmHWM"] / 1024,
                "anon_mb": kb.get("RssAnon", 0) / 1024,
                "file_mb": kb.get("RssFile", 0) / 1024,
            }
        )
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            pass


def _quantized_counts(model) -> dict[str, int]:
    """Weight matmuls by class: QuantLinear (kept quantized) vs nn.Linear (dense float)."""
    import torch.nn as nn

    counts: dict[str, int] = {}
    for mod in model.modules():
        if isinstance(mod, nn.Linear) or type(mod).__name__ in ("QuantLinear", "QuantEmbedding"):
            key = type(mod).__name__ + (f":{mod.ggml_type}" if hasattr(mod, "ggml_type") else "")
            counts[key] = counts.get(key, 0) + 1
    return counts


def _timed(make, lm, n: int, warm_n: int, opts) -> float:
    pk = {"flop_s": None, "bytes_s": None}
    make(lm, warm_n, 0, opts, pk).prepare()()  # warm-up, as llama-bench does before each test
    step = make(lm, n, 0, opts, pk).prepare()
    t0 = time.perf_counter()
    step()
    return time.perf_counter() - t0


def child_main(path: str, pp: int, tg: int, threads: int, fastpath: str = "auto") -> int:
    """One OpScope measurement in this fresh process; one JSON line on stdout."""
    phases = Phases()
    phases.mark("python")
    import torch

    torch.set_num_threads(threads)
    phases.mark("import_torch")
    a = torch.randn(256, 256)
    (a @ a).sum().item()
    phases.mark("first_matmul")
    from opscope.engine.api import load
    from opscope.engine.bench.measure.options import BenchOptions
    from opscope.engine.bench.suites import llm
    from opscope.engine.core.errors import EngineError

    out: dict = {"file": path}
    try:
        lm = load(path, threads=threads, fastpath=fastpath)
    except EngineError as e:
        print(json.dumps(out | {"refused": str(e).splitlines()[0], "phases": phases.rows}))
        return 3
    phases.mark("load")
    out |= {"describe": lm.describe(), "linears": _quantized_counts(lm.model), "memory": lm.memory_stats()}
    opts = BenchOptions(model=path, threads=threads)
    if pp:
        out["pp_s"] = _timed(llm.pp_point, lm, pp, pp, opts)
        phases.mark("pp")
    if tg:
        out["tg_s"] = _timed(llm.tg_point, lm, tg, 1, opts)
        phases.mark("tg")
    out |= {"kv_cache_bytes": lm.memory_stats()["kv_cache_bytes"], "threads": torch.get_num_threads()}
    phases.mark("end")
    out["phases"] = phases.rows
    print(json.dumps(out))
    return 0


# ---------------------------------------------------------------- one round


def build_kernels() -> None:
    """Build (or find) the fast-path kernels before measuring: a rebuild inside a measured child
    would count the compiler's time and memory."""
    subprocess.run(
        [sys.executable, "-c", "from opscope.engine.fastpath.kernels import load_kernels; load_kernels()"],
        cwd=REPO,
        check=False,
    )


def run_opscope(path: Path, pp: int, tg: int, threads: int, fastpath: str = "auto") -> dict:
    from opscope.engine.bench.peers.llama_bench import run_child

    env = os.environ | {"OMP_NUM_THREADS": str(threads)}
    argv = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        str(path),
        "--pp",
        str(pp),
        "--tg",
        str(tg),
        "--threads",
        str(threads),
        "--fastpath",
        fastpath,
    ]
    child = run_child(argv, env=env)
    lines = [ln for ln in child.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        tail = " | ".join(child.stderr.strip().splitlines()[-2:])
        return {"error": f"exit {child.status}: {tail}", "peak_rss_bytes": child.peak_rss_bytes}
    out = json.loads(lines[-1]) | {"wait4_rss_bytes": child.peak_rss_bytes, "wall_s": child.wall_s}
    return out | {"peak_rss_bytes": peak_rss_bytes(out)}


def peak_rss_bytes(run: dict) -> int | None:
    """A process's own peak RSS. The OpScope child's phase marks reset VmHWM (clear_refs) and cover
    its whole life, so its peak is the largest of its phases' peaks (wait4's figure also counts its own children, e.g. a compiler). os.wait4's ru_maxrss is no
    use there: the marks reset it too, and it also counts the child's own children (a kernel
    rebuild's compiler: 1.6 GB)."""
    phases = run.get("phases")
    if phases:
        return int(max(p["peak_mb"] for p in phases) * MiB)
    return run.get("peak_rss_bytes")


def run_llama(path: Path, pp: int, tg: int, threads: int) -> dict:
    from opscope.engine.bench.peers import llama_bench

    try:  # llama.cpp's OpenMP threads spin-wait: on a shared 2-core host, passive (same text, no collapse)
        r = llama_bench.run(TOOLS / "llama-bench", path, pp, tg, threads, env=os.environ | PEER_ENV)
    except RuntimeError as e:
        return {"error": str(e)}
    return {
        "pp_s": r.pp_s[0] if r.pp_s else None,
        "tg_s": r.tg_s[0] if r.tg_s else None,
        "peak_rss_bytes": r.peak_rss_bytes,
        "wall_s": r.wall_s,
        "info": r.info,
    }


def measure_type(kind: str, path: Path, rounds: int, pp: int, tg: int, threads: int, fastpath: str = "auto") -> dict:
    rec: dict = {
        "type": kind,
        "file": str(path),
        "file_bytes": path.stat().st_size,
        "tensor_types": tensor_types(path),
        "rounds": [],
    }
    for r in range(rounds):
        order = ("llama", "opscope") if r % 2 == 0 else ("opscope", "llama")
        one = {}
        for who in order:
            one[who] = (
                run_llama(path, pp, tg, threads) if who == "llama" else run_opscope(path, pp, tg, threads, fastpath)
            )
        rec["rounds"].append(one)
        log.info("%s round %d: %s", kind, r + 1, _round_line(one, pp, tg))
        if "refused" in one["opscope"]:
            break  # the engine will refuse it every time: llama-bench's one round is kept
    return rec


def _round_line(one: dict, pp: int, tg: int) -> str:
    def f(d: dict, key: str, n: int) -> str:
        return f"{n / d[key]:.1f}" if d.get(key) else "-"

    o, lb = one["opscope"], one["llama"]
    status = o.get("refused") or o.get("error") or ""
    return (
        f"tg {f(o, 'tg_s', tg)} vs {f(lb, 'tg_s', tg)}, pp {f(o, 'pp_s', pp)} vs {f(lb, 'pp_s', pp)}, "
        f"RSS {(o.get('peak_rss_bytes') or 0) / MiB:.0f} vs {(lb.get('peak_rss_bytes') or 0) / MiB:.0f} MiB "
        f"{status}"
    ).strip()


# ---------------------------------------------------------------- summary


@dataclass(frozen=True)
class Spread:
    median: float
    lo: float
    hi: float
    n: int

    def fmt(self, digits: int = 1) -> str:
        if self.n == 1:
            return f"{self.median:.{digits}f}"
        return f"{self.median:.{digits}f} [{self.lo:.{digits}f}–{self.hi:.{digits}f}]"


def spread(values: list[float]) -> Spread | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return Spread(statistics.median(values), min(values), max(values), len(values))


def kv_bytes_needed(path: Path, positions: int) -> int:
    """Float32 K and V (the engine's cache dtype) for ``positions`` positions of this model, from
    the file's metadata (read directly: a file the engine refuses still gets its budget)."""
    import gguf

    fields = gguf.GGUFReader(str(path)).fields
    arch = fields["general.architecture"].contents()

    def get(key: str, default: int | None = None) -> int:
        f = fields.get(f"{arch}.{key}")
        return int(f.contents()) if f is not None else default

    heads = get("attention.head_count")
    head_dim = get("attention.key_length", get("embedding_length") // heads)
    return 2 * get("block_count") * get("attention.head_count_kv", heads) * head_dim * 4 * positions


def summarize(rec: dict, pp: int, tg: int) -> dict:
    def tok_s(who: str, key: str, n: int) -> list:
        return [n / one[who][key] if one[who].get(key) else None for one in rec["rounds"]]

    def ratios(key: str, n: int) -> list:
        o, lb = tok_s("opscope", key, n), tok_s("llama", key, n)
        return [a / b if a and b else None for a, b in zip(o, lb)]

    def rss(who: str) -> list:
        return [peak_rss_bytes(one[who]) / MiB if peak_rss_bytes(one[who]) else None for one in rec["rounds"]]

    first = rec["rounds"][0]["opscope"]
    s = {
        "tg_opscope": spread(tok_s("opscope", "tg_s", tg)),
        "tg_llama": spread(tok_s("llama", "tg_s", tg)),
        "pp_opscope": spread(tok_s("opscope", "pp_s", pp)),
        "pp_llama": spread(tok_s("llama", "pp_s", pp)),
        "tg_ratio": spread(ratios("tg_s", tg)),
        "pp_ratio": spread(ratios("pp_s", pp)),
        "rss_opscope": spread(rss("opscope") if "refused" not in first else []),
        "rss_llama": spread(rss("llama")),
        "status": _status(first),
        "linears": first.get("linears", {}),
    }
    kv = kv_bytes_needed(Path(rec["file"]), max(pp, tg))
    s["rss_budget_mib"] = (rec["file_bytes"] + kv + RSS_SLACK_BYTES) / MiB
    s["kv_needed_mib"] = kv / MiB
    return s


def _status(opscope: dict) -> str:
    if "refused" in opscope:
        return f"refused: {opscope['refused']}"
    return opscope.get("error") or "ok"


def _goal(value: Spread | None, goal: float, higher: bool = True) -> str:
    if value is None:
        return "–"
    ok = value.median >= goal if higher else value.median <= goal
    return "✓" if ok else "✗"


def _linears(counts: dict) -> str:
    q = sum(v for k, v in counts.items() if k.startswith("QuantLinear"))
    dense = sum(v for k, v in counts.items() if k == "Linear")
    return f"{q}/{dense}"


def markdown(records: list[dict], meta: dict) -> str:
    pp, tg = meta["pp"], meta["tg"]
    spec = meta.get("fastpath", "auto")
    head = (
        f"# GGUF types: OpScope vs llama-bench ({meta['threads']} threads, {meta['rounds']} rounds"
        f"{'' if spec == 'auto' else ', OpScope fast path ' + spec})\n\n"
        f"Source: {meta['source']} (re-quantized by llama-quantize --allow-requantize; F16/BF16 straight "
        f"from it). Started {meta['started']}, load average before {meta['load_before']}, after "
        f"{meta['load_after']} (1/5/15 min; the machine has {os.cpu_count()} cores). Figures: median "
        f"[min–max] over rounds, tok/s; ratio = OpScope / llama.cpp per round. RSS: each process's own "
        f"peak (VmHWM / os.wait4), MiB. Goals: tg{tg} ≥ {GOAL_TG}×, pp{pp} ≥ {GOAL_PP}×, RSS ≤ file + KV "
        f"({max(pp, tg)} positions, float32) + 450 MiB. linears q/dense: weight matmuls kept quantized "
        f"vs dense float.\n\n" + host_lines(meta)
    )
    cols = [
        "type",
        "file MiB",
        "tensor types",
        f"OpScope tg{tg}",
        f"llama tg{tg}",
        "tg ratio",
        "",
        f"OpScope pp{pp}",
        f"llama pp{pp}",
        "pp ratio",
        "",
        "OpScope RSS",
        "llama RSS",
        "RSS budget",
        "",
        "linears q/dense",
        "status",
    ]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for rec in records:
        s = rec["summary"]

        def g(key: str, digits: int = 1, s=s) -> str:
            return s[key].fmt(digits) if s[key] else "–"

        types = ", ".join(f"{k}×{v}" for k, v in rec["tensor_types"].items())
        rss_ok = _goal(s["rss_opscope"], s["rss_budget_mib"], higher=False)
        row = [
            rec["type"],
            f"{rec['file_bytes'] / MiB:.0f}",
            types,
            g("tg_opscope"),
            g("tg_llama"),
            g("tg_ratio", 2),
            _goal(s["tg_ratio"], GOAL_TG),
            g("pp_opscope"),
            g("pp_llama"),
            g("pp_ratio", 2),
            _goal(s["pp_ratio"], GOAL_PP),
            g("rss_opscope", 0),
            g("rss_llama", 0),
            f"{s['rss_budget_mib']:.0f}",
            rss_ok,
            _linears(s["linears"]),
            s["status"],
        ]
        lines.append("| " + " | ".join(row) + " |")
    return head + "\n".join(lines) + "\n\n" + phases_table(records)


def phases_table(records: list[dict]) -> str:
    """RSS after each phase of the first OpScope round of each type (where the memory goes)."""
    out = ["## OpScope RSS by phase (first round; MiB: RSS after the phase / peak within it; anon + file)\n"]
    names = ["python", "import_torch", "first_matmul", "load", "pp", "tg"]
    out.append("| type | " + " | ".join(names) + " |")
    out.append("|" + "---|" * (len(names) + 1))
    for rec in records:
        rows = {p["phase"]: p for p in rec["rounds"][0]["opscope"].get("phases", [])}
        cells = [_phase_cell(rows[n]) if n in rows else "–" for n in names]
        out.append(f"| {rec['type']} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def _phase_cell(row: dict) -> str:
    return f"{row['rss_mb']:.0f} / {row['peak_mb']:.0f} ({row['anon_mb']:.0f}+{row['file_mb']:.0f})"


def _json_default(o):
    if isinstance(o, Spread):
        return o.__dict__
    raise TypeError(type(o))


# ---------------------------------------------------------------- main


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def host_meta() -> dict:
    """What every result file records about the host: the CPU and its flags (lscpu), and the
    kernel variant OpScope runs (OPSCOPE_CPU_VARIANT forces one: an AVX2 host stood in for)."""
    out = {"peer_env": " ".join(f"{k}={v}" for k, v in PEER_ENV.items())}
    wanted = STAND_IN.get(os.environ.get("OPSCOPE_CPU_VARIANT", ""), ("", {}))[1]
    limits = {k: os.environ[k] for k in wanted if k in os.environ}  # a variant forced alone sets none
    if limits:
        out["stand_in"] = " ".join(f"{k}={v}" for k, v in limits.items()) + f"; peer: only {TOOLS}"
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=30).stdout
        fields = dict(line.split(":", 1) for line in lscpu.splitlines() if ":" in line)
        out["cpu"] = fields.get("Model name", "?").strip()
        out["cpu_flags"] = fields.get("Flags", "").strip()
    except OSError:
        out["cpu"], out["cpu_flags"] = "?", ""
    from opscope.engine.fastpath.kernels import variants

    try:
        out["kernel_variant"] = variants.reason(variants.chosen())
    except variants.VariantError as e:
        out["kernel_variant"] = f"none: {e}"
    return out


def host_lines(meta: dict) -> str:
    """The host paragraph of a results file."""
    return (
        f"CPU: {meta.get('cpu', '?')}; OpScope kernels: {meta.get('kernel_variant', '?')}; peer run with "
        f"{meta.get('peer_env', '-')}.\n\n"
        + (f"Stand-in for a narrower CPU: {meta['stand_in']}.\n\n" if meta.get("stand_in") else "")
        + f"lscpu flags: `{meta.get('cpu_flags', '?')}`\n\n"
    )


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--types", default=",".join(TYPES), help="comma-separated (default: all)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--quick", action="store_true", help="pp64/tg16, one round (checks the harness)")
    ap.add_argument("--source", default=None, help="GGUF to re-quantize (default: the embedded model)")
    ap.add_argument("--cache", default=str(CACHE), help="where the re-quantized files go")
    ap.add_argument("--out", default=str(RESULTS / "gguf_types"), help="results path without suffix")
    ap.add_argument(
        "--render",
        default=None,
        metavar="JSON",
        help="re-render the Markdown table from a raw JSON this script wrote, and exit",
    )
    ap.add_argument(
        "--fastpath",
        default="auto",
        help="OpScope's fast-path spec, e.g. activations=q8 (llama.cpp's int8-activation scheme)",
    )
    ap.add_argument(
        "--variant",
        default=None,
        help="OpScope's CPU kernel variant (OPSCOPE_CPU_VARIANT), e.g. avx2 on an AVX-512 host",
    )
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.variant:
        os.environ["OPSCOPE_CPU_VARIANT"] = args.variant  # the children inherit it
        stand_in(args.variant)
    return args


def stand_in(variant: str) -> None:
    """Limit torch's libraries and the peer to ``variant``'s instruction set (see STAND_IN)."""
    global TOOLS
    if variant not in STAND_IN:
        return
    peer_lib, env = STAND_IN[variant]
    os.environ.update(env)
    TOOLS = peer_with_only(peer_lib)


def peer_with_only(lib: str) -> Path:
    """A copy of the peer's tools that can load only its ``lib`` CPU library: ggml's loader picks the
    best library beside the binary, so the others are left out (the binaries are copied, not linked,
    as the loader looks beside the resolved executable)."""
    import shutil

    out = CACHE.parent / f"llama_{lib}"
    (out / "libexec").mkdir(parents=True, exist_ok=True)
    for tool in ("llama-bench", "llama-quantize"):
        shutil.copy2(TOOLS / "libexec" / tool, out / "libexec" / tool)
        shutil.copy2(TOOLS / tool, out / tool)
    shutil.copy2(TOOLS / "libexec" / f"libggml-cpu-{lib}.so", out / "libexec")
    if not (out / "lib").exists():
        (out / "lib").symlink_to((TOOLS / "lib").resolve())
    return out


def run(args: argparse.Namespace, source: Path, types: list[str], title_extra: dict | None = None) -> list[dict]:
    """Quantize ``types`` from ``source``, measure each, write the Markdown table and raw JSON."""
    if args.quick:
        args.pp, args.tg, args.rounds = 64, 16, 1
    meta = (
        {
            "source": str(source),
            "threads": args.threads,
            "rounds": args.rounds,
            "pp": args.pp,
            "tg": args.tg,
            "fastpath": args.fastpath,
            "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "load_before": loadavg(),
            "tools": str(TOOLS),
        }
        | host_meta()
        | (title_extra or {})
    )
    build_kernels()
    files = {}
    for kind in types:
        try:
            files[kind] = quantize(source, kind, Path(args.cache), args.threads)
        except RuntimeError as e:
            log.error("%s", e)
    records = []
    for kind, path in files.items():
        rec = measure_type(kind, path, args.rounds, args.pp, args.tg, args.threads, args.fastpath)
        rec["summary"] = summarize(rec, args.pp, args.tg)
        records.append(rec)
        _write(records, meta | {"load_after": loadavg()}, Path(args.out))  # partial results survive a kill
    meta["load_after"] = loadavg()
    _write(records, meta, Path(args.out))
    return records


def _write(records: list[dict], meta: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "types": records}, indent=1, default=_json_default))
    out.with_suffix(".md").write_text(markdown(records, meta))


def render(raw: Path) -> int:
    """Summaries and Markdown again from the raw rounds of ``raw`` (written beside it as .md)."""
    data = json.loads(raw.read_text())
    meta = data["meta"]
    for rec in data["types"]:
        rec["summary"] = summarize(rec, meta["pp"], meta["tg"])
    _write(data["types"], meta, raw.with_suffix(""))
    print(raw.with_suffix(".md").read_text())
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(args.child, args.pp, args.tg, args.threads, args.fastpath)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.render:
        return render(Path(args.render))
    from opscope.engine.core.defaults import default_model_path

    source = Path(args.source) if args.source else default_model_path()
    types = [t.strip().upper() for t in args.types.split(",") if t.strip()]
    run(args, source, types)
    print(Path(args.out).with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
