"""The GPU check's benchmarks, run store and telemetry: `opscope bench` per suite (its run read
back with `runs export`), `runs compare`, and `opscope monitor` (NVML) against `nvidia-smi` while
`bench llm` runs. Figures are judged against the detected GPU's datasheet (probe.py info).
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from checks import (
    RATIO_CEIL,
    RATIO_FLOOR,
    SMI_FIELDS,
    _gen_figures,
    _generate,
    model_path,
)
from harness import CheckFailed, Ctx, fail, median, which

# -- bench and the run store -------------------------------------------------------------------------


def _bench(ctx: Ctx, suite: str, name: str, *flags: str, timeout_s: float = 180) -> dict[str, Any]:
    ctx.cli("bench", suite, "--name", name, *flags, timeout_s=timeout_s)
    export = ctx.scratch / f"{name}.json"
    ctx.cli("runs", "export", name, "-o", str(export), timeout_s=60)
    return json.loads(export.read_text())


def metric_medians(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    out = {}
    for m in run.get("metrics", []):
        samples = [s for s in (m.get("samples") or []) if isinstance(s, (int, float))]
        out[m["name"]] = {
            "unit": m.get("unit"),
            "median": median(samples) if samples else None,
            "n": len(samples),
            "status": m.get("status"),
        }
    return out


_PREFIX = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def per_second(value: float, unit: str) -> float:
    """GB/s, TFLOP/s, … in base units per second (B/s, FLOP/s)."""
    m = re.match(r"([KMGT]?)(i?)(B|FLOP)/s", unit or "")
    if not m:
        raise CheckFailed(f"unexpected unit {unit!r}")
    scale = 1024 ** " KMGT".index(m[1] or " ") if m[2] else _PREFIX[m[1]]
    return value * scale


def _ratio(measured: float, peak: dict[str, Any] | None) -> float | None:
    return measured / peak["value"] if peak and peak.get("value") else None


def bench_bandwidth(ctx: Ctx) -> dict[str, Any]:
    run = _bench(ctx, "bandwidth", "gpu-bandwidth-1", "--device", "cuda", "--repeat", "5")
    med = metric_medians(run)
    best = max((per_second(v["median"], v["unit"]) for v in med.values() if v["median"]), default=0.0)
    ctx.shared["bandwidth_bytes_s"] = best or None
    sheet = (ctx.shared.get("info") or {}).get("datasheet", {}).get("bandwidth")
    figures = {"metrics": med, "best_bytes_s": best, "datasheet": sheet, "ratio": _ratio(best, sheet)}
    _judge_ratio(figures, "device copy bandwidth")
    return figures


def _judge_ratio(figures: dict[str, Any], what: str) -> None:
    r = figures["ratio"]
    if r is None:
        raise fail(f"{what}: no datasheet figure for this GPU", **figures)
    if not RATIO_FLOOR <= r <= RATIO_CEIL:
        raise fail(f"{what}: {r:.2f} of the datasheet, outside {RATIO_FLOOR}..{RATIO_CEIL}", **figures)


def bench_matmul(ctx: Ctx) -> dict[str, Any]:
    run = _bench(ctx, "matmul", "gpu-matmul", "--device", "cuda", "--param", "sizes=2048,4096,8192", "--repeat", "5")
    med = metric_medians(run)
    sheet = (ctx.shared.get("info") or {}).get("datasheet", {})
    figures, bad = {"metrics": med}, []
    for dtype in ("float32", "bfloat16", "float16"):
        rates = [
            per_second(v["median"], v["unit"])
            for k, v in med.items()
            if k.startswith(f"matmul_{dtype}_") and "." not in k and v["median"]
        ]
        best = max(rates, default=0.0)
        figures[dtype] = {
            "best_flop_s": best,
            "datasheet": sheet.get(f"matmul_{dtype}"),
            "ratio": _ratio(best, sheet.get(f"matmul_{dtype}")),
        }
        ratio = figures[dtype]["ratio"]
        # float32 may run as TF32 on tensor cores, past the non-tensor datasheet: no ceiling for it
        if ratio is None or ratio < RATIO_FLOOR or (dtype != "float32" and ratio > RATIO_CEIL):
            bad.append(f"{dtype}: {ratio if ratio is None else round(ratio, 2)} of the datasheet")
    if bad:
        raise fail("matmul against the datasheet peak: " + "; ".join(bad), **figures)
    return figures


def bench_attention(ctx: Ctx) -> dict[str, Any]:
    run = _bench(
        ctx,
        "attention",
        "gpu-attention",
        "--device",
        "cuda",
        "--dtype",
        "bfloat16",
        "--param",
        "seq_lens=512,2048",
        "--repeat",
        "5",
    )
    med = metric_medians(run)
    naive, sdpa = med.get("attn_naive_2048", {}).get("median"), med.get("attn_sdpa_2048", {}).get("median")
    figures = {"metrics": med, "naive_ms_2048": naive, "sdpa_ms_2048": sdpa}
    if not naive or not sdpa:
        raise fail("naive or SDPA attention at T=2048 did not run", **figures)
    if sdpa >= naive:
        raise fail(f"SDPA ({sdpa:.3f} ms) is not faster than naive attention ({naive:.3f} ms) at T=2048", **figures)
    return figures


def bench_crossover(ctx: Ctx) -> dict[str, Any]:
    run = _bench(ctx, "crossover", "gpu-crossover", "--device", "cuda", "--quick")
    return {"metrics": metric_medians(run)}


def bench_collectives(ctx: Ctx) -> dict[str, Any]:
    """`bench collectives --nproc 1`: world size 1 on nccl (gloo in the dry run, on small sizes)."""
    backend, sizes = ("gloo", "65536") if ctx.dry else ("nccl", "8,65536,16777216,268435456")
    proc = ctx.cli(
        "bench",
        "collectives",
        "--name",
        "collectives-1",
        "--device",
        ctx.device,
        "--nproc",
        "1",
        "--quick",
        "--param",
        f"sizes_bytes={sizes}",
        "--param",
        "reps=3",
        timeout_s=240,
    )
    header = proc.stdout.splitlines()[0] if proc.stdout else ""
    if f", {backend}," not in header:
        raise CheckFailed(f"the collectives run does not say it used {backend}: {header!r}")
    export = ctx.scratch / "collectives-1.json"
    ctx.cli("runs", "export", "collectives-1", "-o", str(export), timeout_s=60)
    return {"backend": backend, "metrics": metric_medians(json.loads(export.read_text()))}


def store_compare(ctx: Ctx) -> dict[str, Any]:
    """Two runs saved in the SQLite store and related by `runs compare` (which reads them back)."""
    if ctx.dry:
        flags = (
            "matmul",
            "--device",
            "cpu",
            "--quick",
            "--param",
            "sizes=64",
            "--param",
            "dtypes=float32",
            "--repeat",
            "3",
            "--min-time",
            "0",
            "--load-threshold",
            "64",
        )
        names = ("dry-matmul-1", "dry-matmul-2")
        ctx.cli("bench", *flags, "--name", names[0], timeout_s=120)
    else:
        flags, names = ("bandwidth", "--device", "cuda", "--repeat", "5"), ("gpu-bandwidth-1", "gpu-bandwidth-2")
    ctx.cli("bench", *flags, "--name", names[1], timeout_s=120)
    cmp = ctx.cli("runs", "compare", *names, "--format", "json", timeout_s=60).json()
    found = [r["name"] for r in cmp.get("runs", [])]
    if found != list(names):
        raise CheckFailed(f"`runs compare {' '.join(names)}` read back {found} from the store")
    rows = [row["name"] for sec in cmp.get("sections", []) for row in sec.get("rows", [])]
    return {"db": ctx.db, "compared": found, "metrics_compared": rows, "compare": cmp}


# -- telemetry during a benchmark ------------------------------------------------------------------------


def llm_with_telemetry(ctx: Ctx) -> dict[str, Any]:
    """`bench llm` (pp512/tg128) on the ~1B model while `opscope monitor` (NVML) and `nvidia-smi`
    sample the GPU: the bench's figures, and NVML's read against nvidia-smi's over the same ~20 s."""
    smi = which("nvidia-smi")
    if not smi:
        raise CheckFailed("nvidia-smi is not on PATH: nothing to read NVML against")
    bench = [
        ctx.python,
        "-m",
        "opscope",
        "--db",
        ctx.db,
        "bench",
        "llm",
        "--name",
        "gpu-llm",
        "-m",
        model_path(ctx, "large-f16"),
        "--device",
        "cuda",
        "--dtype",
        "bfloat16",
        "--param",
        "depths=0",
        "--repeat",
        "3",
        "--min-time",
        "8",
        "--telemetry",
        "500",  # pp, tg >= 8 s each: the window
        "--load-threshold",
        "2",
    ]  # the samplers beside it are this check's own, not a disturbance
    ctx.spawn("bench-llm", bench)
    pid = ctx.background["bench-llm"][0].pid
    ctx.spawn("smi", [smi, f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits", "-lms", "1000"])
    ctx.spawn(
        "monitor",
        [ctx.python, "-m", "opscope", "monitor", "--json", "--interval", "500", "--duration", "20", "--pid", str(pid)],
    )
    time.sleep(12)  # mid-window, the model loaded: the bench process's own VRAM as nvidia-smi lists it
    apps = ctx.run([smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"], 30).stdout
    mon = ctx.join("monitor", 60)
    bench_proc = ctx.join("bench-llm", 300)
    ctx.stop_background()
    smi_rows = _smi_rows((ctx.logs / "smi.out").read_text())
    if bench_proc.code != 0:
        raise CheckFailed(f"bench llm exited {bench_proc.code}: {bench_proc.stderr.strip().splitlines()[-1:]}")
    figures = {"telemetry": compare_telemetry(_monitor_rows(mon.stdout), smi_rows, apps, pid)}
    export = ctx.scratch / "gpu-llm.json"
    ctx.cli("runs", "export", "gpu-llm", "-o", str(export), timeout_s=60)
    figures["llm"] = metric_medians(json.loads(export.read_text()))
    bad = figures["telemetry"].pop("disagree")
    if bad:
        raise fail("NVML and nvidia-smi disagree: " + "; ".join(bad), **figures)
    return figures


def _monitor_rows(text: str) -> list[dict[str, float]]:
    rows = []
    for line in text.splitlines():
        if line.startswith("{"):
            rows.append(json.loads(line)["values"])
    return rows


def _smi_rows(text: str) -> list[dict[str, float]]:
    names, rows = SMI_FIELDS.split(","), []
    for line in text.splitlines():
        vals = [v.strip() for v in line.split(",")]
        if len(vals) == len(names):
            rows.append({k: _num(v) for k, v in zip(names, vals)})
    return rows


def _num(v: str) -> float | str:
    try:
        return float(v)
    except ValueError:
        return v


# (NVML series, nvidia-smi field, scale to nvidia-smi's unit, allowed difference: relative, absolute)
PAIRS = (
    ("gpu0.mem_used_bytes", "memory.used", 1 / 2**20, 0.10, 1024),
    ("gpu0.mem_total_bytes", "memory.total", 1 / 2**20, 0.01, 64),
    ("gpu0.power_w", "power.draw", 1.0, 0.25, 60),
    ("gpu0.power_limit_w", "power.limit", 1.0, 0.02, 5),
    ("gpu0.sm_clock_mhz", "clocks.sm", 1.0, 0.15, 100),
    ("gpu0.mem_clock_mhz", "clocks.mem", 1.0, 0.05, 50),
    ("gpu0.temp_c", "temperature.gpu", 1.0, 0.0, 6),
    ("gpu0.util_pct", "utilization.gpu", 1.0, 0.0, 35),
)


def compare_telemetry(nvml: list[dict], smi: list[dict], apps: str, pid: int) -> dict[str, Any]:
    """Medians over the window, NVML (through opscope) against nvidia-smi, and the plausibility of
    what nvidia-smi cannot show (PCIe, throttle reasons, the engine process's own VRAM)."""
    out: dict[str, Any] = {"nvml_samples": len(nvml), "smi_samples": len(smi), "pairs": {}, "disagree": []}
    if len(nvml) < 10 or len(smi) < 5:
        out["disagree"].append(f"too few samples: NVML {len(nvml)}, nvidia-smi {len(smi)}")
        return out
    for series, field, scale, rel, absolute in PAIRS:
        a = median([_value(r, series) * scale for r in nvml])
        b = median([r[field] for r in smi if isinstance(r.get(field), float)])
        out["pairs"][series] = {"nvml": a, "nvidia_smi": b}
        if not (a == a and b == b) or abs(a - b) > max(absolute, rel * abs(b)):
            out["disagree"].append(f"{series} {a:.4g} vs {field} {b:.4g}")
    for series in ("gpu0.pcie_tx_bytes_s", "gpu0.pcie_rx_bytes_s", "gpu0.clock_event_reasons", "gpu0.proc_mem_bytes"):
        out[series] = median([_value(r, series) for r in nvml])
    used = {
        int(p): float(m)
        for p, m in (ln.split(",")[:2] for ln in apps.splitlines() if ln.count(",") >= 1)
        if p.strip().isdigit() and _is_float(m)
    }
    out["nvidia_smi_app_mib"] = used.get(pid)
    proc_mib = out["gpu0.proc_mem_bytes"] / 2**20
    if used.get(pid) is not None and not abs(proc_mib - used[pid]) <= max(256, 0.2 * used[pid]):
        out["disagree"].append(f"engine VRAM {proc_mib:.0f} MiB vs nvidia-smi's {used[pid]:.0f} MiB")
    if out["gpu0.pcie_tx_bytes_s"] != out["gpu0.pcie_tx_bytes_s"]:  # NaN: N/A all along
        out["disagree"].append("PCIe throughput read N/A")
    return out


def _value(row: dict, series: str) -> float:
    """A monitor sample's value; N/A (absent, null or NaN) as NaN."""
    v = row.get(series)
    return float(v) if isinstance(v, (int, float)) else float("nan")


def _is_float(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def energy(ctx: Ctx) -> dict[str, Any]:
    """Joules per token from NVML's total-energy counter, on the ~1B model's bfloat16 generation
    (256 tokens: seconds of decode, many updates of the counter)."""
    out = _generate(ctx, "large-f16", "--device", "cuda", "--dtype", "bfloat16", n=256, timeout_s=150)
    figures = _gen_figures(out)
    if out.get("energy_source") != "NVML total energy":
        raise fail(f"energy source is {out.get('energy_source')!r}, not NVML's total-energy counter", **figures)
    j = out.get("decode_j_per_token")
    if not j or not 0.01 <= j <= 100:
        raise fail(f"decode J/token {j} is implausible for a ~1B model", **figures)
    return figures
