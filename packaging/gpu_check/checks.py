"""The checks of the GPU check, each a function of the context returning its figures or raising
CheckFailed / Skipped. They drive the `opscope` command as a user types it (generate, trace, bench,
monitor, runs); probe.py measures the two things no command prints (logits against the CPU, the
GPU's datasheet peaks). ``PLAN`` is their order: cheap and fundamental first, so a budget that runs
out cuts the least.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable

from harness import CheckFailed, Ctx, fail, median, which

HERE = Path(__file__).resolve().parent
PROBE = HERE / "probe.py"
PROMPT = "The quick brown fox jumps over the lazy dog"
TOKENS = 16
# ‖logits − CPU float32 logits‖ / ‖CPU float32 logits‖ on the tiny model, per variant. float32 allows
# TF32-class rounding; bf16 has 8 mantissa bits; int8/int4 re-quantize the weights (per channel;
# groups of 32), so their bound is the quantization's own error, not the kernels'.
LOGIT_TOLERANCE = {"float32": 2e-3, "float16": 1e-2, "bfloat16": 3e-2,
                   "int8:bfloat16": 6e-2, "int4:bfloat16": 0.3}
# Measured over datasheet: below the floor the path is broken (or something else ran on the GPU);
# above the ceiling the measurement counts wrong.
RATIO_FLOOR, RATIO_CEIL = 0.3, 1.15


# -- environment and models ----------------------------------------------------------------------

def environment(ctx: Ctx) -> dict[str, Any]:
    info = ctx.python_file(PROBE, "info", timeout_s=90).json()
    ctx.shared["info"] = info
    figures = {"probe": info}
    smi = which("nvidia-smi")
    if smi:
        figures["nvidia_smi"] = _smi_query(ctx, smi)
        figures["nvidia_smi_q"] = _smi_q_lines(ctx.run([smi, "-q"], 30).stdout)
    if ctx.dry:
        return figures
    if not info.get("cuda_available"):
        raise fail("torch sees no CUDA device (torch.cuda.is_available() is False)", **figures)
    if not smi:
        raise fail("nvidia-smi is not on PATH: nothing to cross-check NVML against", **figures)
    return figures


SMI_FIELDS = ("name,driver_version,pstate,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.draw,"
              "power.limit,temperature.gpu,memory.used,memory.total,utilization.gpu,pcie.link.gen.current,"
              "pcie.link.width.current")
SMI_Q_KEYS = ("Product Name", "Driver Version", "CUDA Version", "VBIOS Version", "Persistence Mode",
              "Compute Mode", "Performance State", "Graphics", "SM", "Memory", "Total", "Used", "Power Draw",
              "Current Power Limit", "Max Power Limit", "GPU Current Temp", "Current", "Device Current",
              "Link Width", "Bus Id", "MIG Mode", "Addressing Mode", "SW Power Capping", "HW Slowdown",
              "SW Thermal Slowdown", "HW Thermal Slowdown", "Idle", "Fan Speed")


def _smi_query(ctx: Ctx, smi: str) -> dict[str, str]:
    proc = ctx.run([smi, f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits"], 30)
    values = [v.strip() for v in proc.stdout.splitlines()[0].split(",")] if proc.stdout.strip() else []
    return dict(zip(SMI_FIELDS.split(","), values)) if proc.code == 0 else {"error": proc.stderr.strip()}


def _smi_q_lines(text: str) -> list[str]:
    """The lines of `nvidia-smi -q` worth keeping: identity, clocks, power, memory, link, throttling."""
    keep = []
    for line in text.splitlines():
        key = line.split(":", 1)[0].strip()
        if ":" in line and key in SMI_Q_KEYS:
            keep.append(line.rstrip())
    return keep


def models_tiny(ctx: Ctx) -> dict[str, Any]:
    ctx.scratch.joinpath("models").mkdir(parents=True, exist_ok=True)
    large = "small" if ctx.dry else "1b"  # the dry run's stand-in: the same writer, a CPU-sized shape
    ctx.spawn("models-large", [ctx.python, str(PROBE), "models", str(ctx.scratch / "models"), large,
                               "--types", "F16,Q8_0"])
    made = ctx.python_file(PROBE, "models", str(ctx.scratch / "models"), "tiny", "--types", "F16,Q8_0",
                           timeout_s=120).json()
    ctx.models.update({f"tiny-{t.lower()}": Path(f["path"]) for t, f in made["files"].items()})
    return made


def models_large(ctx: Ctx) -> dict[str, Any]:
    proc = ctx.join("models-large", 300)
    if proc.code != 0:
        raise CheckFailed(f"writing the Llama-shaped model failed: {proc.stderr.strip().splitlines()[-1:]}")
    made = proc.json()
    ctx.models.update({f"large-{t.lower()}": Path(f["path"]) for t, f in made["files"].items()})
    ctx.shared["large_params"] = made["params"]
    return made


# -- generate ---------------------------------------------------------------------------------------

def _generate(ctx: Ctx, model: str, *flags: str, n: int = TOKENS, timeout_s: float = 180) -> dict[str, Any]:
    args = ["generate", "-m", str(ctx.models[model]), "--temperature", "0", "--ignore-eos", "-n", str(n),
            "--json", *flags, PROMPT]
    return ctx.cli(*args, timeout_s=timeout_s).json()


def cpu_reference(ctx: Ctx) -> dict[str, Any]:
    out = _generate(ctx, "tiny-f16", "--device", "cpu", "--dtype", "float32", "--fastpath", "off")
    ctx.shared["reference_text"] = out["text"]
    return _gen_figures(out)


def _gen_figures(out: dict[str, Any]) -> dict[str, Any]:
    keys = ("text", "generated_tokens", "ttft_ms", "prefill_tok_s", "decode_tok_s", "tpot_ms", "device", "dtype",
            "decode_j_per_token", "prefill_j_per_token", "energy_source")
    return {k: out.get(k) for k in keys}


def _same_tokens(ctx: Ctx, out: dict[str, Any], what: str) -> dict[str, Any]:
    figures = _gen_figures(out)
    ref = ctx.shared.get("reference_text")
    if ref is None:
        raise fail("no CPU reference text (the cpu-reference check failed)", **figures)
    if out["text"] != ref:
        raise fail(f"{what}: greedy text differs from the CPU float32 run: {out['text']!r} vs {ref!r}", **figures)
    return figures


def generate_cuda_float32(ctx: Ctx) -> dict[str, Any]:
    out = _generate(ctx, "tiny-f16", "--device", "cuda", "--dtype", "float32")
    return _same_tokens(ctx, out, "cuda float32 eager")


def generate_compile_decode(ctx: Ctx) -> dict[str, Any]:
    out = _generate(ctx, "tiny-f16", "--device", "cuda", "--dtype", "float32", "--compile", "decode",
                    timeout_s=240)
    return _same_tokens(ctx, out, "cuda float32 --compile decode")


def generate_nproc1(ctx: Ctx) -> dict[str, Any]:
    """The tensor-parallel path as a world of one: nccl on the GPU (gloo in the dry run)."""
    out = _generate(ctx, "tiny-f16", "--device", ctx.device, "--dtype", "float32", "--nproc", "1", timeout_s=180)
    figures = _same_tokens(ctx, out, f"{ctx.device} float32 --nproc 1")
    if not out.get("tensor_parallel"):
        raise fail("--nproc 1 did not run the tensor-parallel path", **figures)
    return figures


def logits(ctx: Ctx) -> dict[str, Any]:
    """One probe over every variant: the GPU's logits against the CPU float32 reference. The dry
    run compares the CPU's own bfloat16 with its float32, so the probe itself cannot rot."""
    device = "cpu" if ctx.dry else "cuda"
    variants = ["bfloat16"] if ctx.dry else list(LOGIT_TOLERANCE)
    res = ctx.python_file(PROBE, "logits", str(ctx.models["tiny-f16"]), "--device", device,
                          "--variants", ",".join(variants), timeout_s=240).json()
    bad = []
    for r in res["results"]:
        r["tolerance"] = LOGIT_TOLERANCE[r["variant"]]
        if r.get("error") or not r["rel_error"] <= r["tolerance"]:
            bad.append(f"{r['variant']}: {r.get('error') or format(r['rel_error'], '.2e')} (tolerance {r['tolerance']:.0e})")
    if bad:
        raise fail("logits off the CPU float32 reference: " + "; ".join(bad), **res)
    return res


def generate_large(ctx: Ctx) -> dict[str, Any]:
    """The ~1B model's speed in each GPU mode: TTFT, decode tok/s and MBU against the measured copy
    bandwidth (weights read once per token; the KV cache of 64 tokens is left out, < 1 %)."""
    params = ctx.shared.get("large_params")
    if not params:
        raise CheckFailed("no Llama-shaped model (the models-large check failed)")
    bw = ctx.shared.get("bandwidth_bytes_s")
    modes = {"float16": ("large-f16", ["--dtype", "float16"], 2.0),
             "bfloat16": ("large-f16", ["--dtype", "bfloat16"], 2.0),
             "q8_0-file bfloat16": ("large-q8_0", ["--dtype", "bfloat16"], 2.0),
             "int8 bfloat16": ("large-f16", ["--dtype", "bfloat16", "--quantize", "int8"], 1.0),
             "int4 bfloat16": ("large-f16", ["--dtype", "bfloat16", "--quantize", "int4"], 0.5)}
    figures, bad = {"params": params, "bandwidth_bytes_s": bw}, []
    for name, (model, flags, bytes_per_param) in modes.items():
        try:
            out = _generate(ctx, model, "--device", "cuda", *flags, n=64, timeout_s=150)
        except CheckFailed as e:
            bad.append(f"{name}: {e}")
            continue
        f = _gen_figures(out)
        f["weight_bytes"] = params * bytes_per_param
        f["mbu"] = f["weight_bytes"] * out["decode_tok_s"] / bw if bw else None
        figures[name] = f
        if not out.get("decode_tok_s") or (f["mbu"] is not None and f["mbu"] > RATIO_CEIL):
            bad.append(f"{name}: implausible decode rate {out.get('decode_tok_s')} tok/s (MBU {f['mbu']})")
    if bad:
        raise fail("; ".join(bad), **figures)
    return figures


# -- trace -----------------------------------------------------------------------------------------

REPO = HERE.parent.parent


def _bug_line(relpath: str, marker: str) -> str:
    """"path:line" of the line holding ``marker``: what the report must point at."""
    for i, line in enumerate((REPO / relpath).read_text().splitlines(), 1):
        if marker in line:
            return f"{relpath}:{i}"
    raise CheckFailed(f"no line marked {marker!r} in {relpath}")


def _trace_model(ctx: Ctx, *flags: str) -> dict[str, Any]:
    device = "meta" if ctx.dry else "cuda"  # meta: an accelerator's op stream, simulated on the CPU
    return ctx.cli("trace", "-m", str(ctx.models["tiny-f16"]), "--device", device, "--tokens", "4",
                   "--fastpath", "off", "--json", "--no-save", *flags, "Hi", timeout_s=150).json()


def _trace_figures(r: dict[str, Any]) -> dict[str, Any]:
    keys = ("target", "tokens", "ops", "ops_on_target_pct", "time_on_target_pct", "time_basis", "transfers",
            "syncs", "syncs_per_token", "simulated", "notes")
    return {k: r.get(k) for k in keys} | {"findings": [f["title"] for f in r.get("findings", [])]}


def _device_times(ctx: Ctx, r: dict[str, Any], figures: dict[str, Any]) -> None:
    if not ctx.dry and r.get("time_basis") != "device":
        raise fail(f"op times are {r.get('time_basis')} times, not CUDA-event device times", **figures)


def trace_clean(ctx: Ctx) -> dict[str, Any]:
    r = _trace_model(ctx)
    figures = _trace_figures(r)
    if r.get("findings"):
        raise fail(f"the clean model has findings: {figures['findings']}", **figures)
    _device_times(ctx, r, figures)
    return figures


def trace_leaky_norm(ctx: Ctx) -> dict[str, Any]:
    r = _trace_model(ctx, "--variant", "leaky-norm")
    figures = _trace_figures(r)
    line = _bug_line("engine/trace/planted.py", "BUG: computes on the host")
    hits = [f for f in r.get("findings", []) if f["kind"] == "fallback" and line in f.get("sources", [])]
    per_token = {t["direction"]: t["per_token_count"] for t in r.get("transfers", [])}
    figures.update(expected_line=line, transfers_per_token=per_token)
    if not hits:
        raise fail(f"no fallback finding at {line}: {figures['findings']}", **figures)
    if not (per_token.get("D2H", 0) >= 1 and per_token.get("H2D", 0) >= 1 and r.get("syncs_per_token", 0) >= 1):
        raise fail(f"expected D2H and H2D copies and syncs every token, got {per_token}, "
                   f"{r.get('syncs_per_token')} syncs/token", **figures)
    _device_times(ctx, r, figures)
    return figures


def _trace_script(ctx: Ctx, script: str) -> dict[str, Any]:
    report = ctx.scratch / f"trace-{Path(script).stem}.json"
    ctx.cli("trace", "--target", ctx.device, "--report", str(report), "--no-save", "--", "python", script,
            "--steps", "6", "--device", ctx.device, timeout_s=150)
    return json.loads(report.read_text())


def trace_slow_train(ctx: Ctx) -> dict[str, Any]:
    r = _trace_script(ctx, "examples/slow_train.py")
    figures = _trace_figures(r)
    line = _bug_line("examples/slow_train.py", "BUG: one .item() per row")
    figures["expected_line"] = line
    if not [f for f in r.get("findings", []) if f["kind"] == "storm" and line in f.get("sources", [])]:
        raise fail(f"no per-element storm named at {line}: {figures['findings']}", **figures)
    _device_times(ctx, r, figures)
    return figures


def trace_fast_train(ctx: Ctx) -> dict[str, Any]:
    r = _trace_script(ctx, "examples/fast_train.py")
    figures = _trace_figures(r)
    if r.get("findings"):
        raise fail(f"fast_train.py has findings: {figures['findings']}", **figures)
    _device_times(ctx, r, figures)
    return figures


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
        out[m["name"]] = {"unit": m.get("unit"), "median": median(samples) if samples else None,
                          "n": len(samples), "status": m.get("status")}
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
    run = _bench(ctx, "matmul", "gpu-matmul", "--device", "cuda", "--param", "sizes=2048,4096,8192",
                 "--repeat", "5")
    med = metric_medians(run)
    sheet = (ctx.shared.get("info") or {}).get("datasheet", {})
    figures, bad = {"metrics": med}, []
    for dtype in ("float32", "bfloat16", "float16"):
        rates = [per_second(v["median"], v["unit"]) for k, v in med.items()
                 if k.startswith(f"matmul_{dtype}_") and "." not in k and v["median"]]
        best = max(rates, default=0.0)
        figures[dtype] = {"best_flop_s": best, "datasheet": sheet.get(f"matmul_{dtype}"),
                          "ratio": _ratio(best, sheet.get(f"matmul_{dtype}"))}
        ratio = figures[dtype]["ratio"]
        # float32 may run as TF32 on tensor cores, past the non-tensor datasheet: no ceiling for it
        if ratio is None or ratio < RATIO_FLOOR or (dtype != "float32" and ratio > RATIO_CEIL):
            bad.append(f"{dtype}: {ratio if ratio is None else round(ratio, 2)} of the datasheet")
    if bad:
        raise fail("matmul against the datasheet peak: " + "; ".join(bad), **figures)
    return figures


def bench_attention(ctx: Ctx) -> dict[str, Any]:
    run = _bench(ctx, "attention", "gpu-attention", "--device", "cuda", "--dtype", "bfloat16",
                 "--param", "seq_lens=512,2048", "--repeat", "5")
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
    proc = ctx.cli("bench", "collectives", "--name", "collectives-1", "--device", ctx.device, "--nproc", "1",
                   "--quick", "--param", f"sizes_bytes={sizes}", "--param", "reps=3", timeout_s=240)
    header = proc.stdout.splitlines()[0] if proc.stdout else ""
    if f", {backend}," not in header:
        raise CheckFailed(f"the collectives run does not say it used {backend}: {header!r}")
    export = ctx.scratch / "collectives-1.json"
    ctx.cli("runs", "export", "collectives-1", "-o", str(export), timeout_s=60)
    return {"backend": backend, "metrics": metric_medians(json.loads(export.read_text()))}


def store_compare(ctx: Ctx) -> dict[str, Any]:
    """Two runs in the SQLite store, `runs list` shows them, `runs compare` relates them."""
    if ctx.dry:
        flags = ("matmul", "--device", "cpu", "--quick", "--param", "sizes=64", "--param", "dtypes=float32",
                 "--repeat", "3", "--min-time", "0", "--load-threshold", "64")
        names = ("dry-matmul-1", "dry-matmul-2")
        ctx.cli("bench", *flags, "--name", names[0], timeout_s=120)
    else:
        flags, names = ("bandwidth", "--device", "cuda", "--repeat", "5"), ("gpu-bandwidth-1", "gpu-bandwidth-2")
    ctx.cli("bench", *flags, "--name", names[1], timeout_s=120)
    listed = ctx.cli("runs", "list", timeout_s=60).stdout
    missing = [n for n in names if n not in listed]
    if missing:
        raise CheckFailed(f"`runs list` does not show {missing}")
    cmp = ctx.cli("runs", "compare", *names, "--format", "json", timeout_s=60).json()
    return {"db": ctx.db, "compared": list(names), "compare": cmp}


# -- telemetry during a benchmark ------------------------------------------------------------------------

def llm_with_telemetry(ctx: Ctx) -> dict[str, Any]:
    """`bench llm` (pp512/tg128) on the ~1B model while `opscope monitor` (NVML) and `nvidia-smi`
    sample the GPU: the bench's figures, and NVML's read against nvidia-smi's over the same ~20 s."""
    smi = which("nvidia-smi")
    bench = [ctx.python, "-m", "opscope", "--db", ctx.db, "bench", "llm", "--name", "gpu-llm", "-m",
             str(ctx.models["large-f16"]), "--device", "cuda", "--dtype", "bfloat16", "--param", "depths=0",
             "--repeat", "3", "--telemetry", "500"]
    ctx.spawn("bench-llm", bench)
    pid = ctx.background["bench-llm"][0].pid
    ctx.spawn("smi", [smi, f"--query-gpu={SMI_FIELDS}", "--format=csv,noheader,nounits", "-lms", "1000"])
    mon = ctx.run([ctx.python, "-m", "opscope", "monitor", "--json", "--interval", "500", "--duration", "20",
                   "--pid", str(pid)], 60)
    apps = ctx.run([smi, "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"], 30).stdout
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
PAIRS = (("gpu0.mem_used_bytes", "memory.used", 1 / 2**20, 0.10, 1024),
         ("gpu0.mem_total_bytes", "memory.total", 1 / 2**20, 0.01, 64),
         ("gpu0.power_w", "power.draw", 1.0, 0.25, 60),
         ("gpu0.power_limit_w", "power.limit", 1.0, 0.02, 5),
         ("gpu0.sm_clock_mhz", "clocks.sm", 1.0, 0.15, 100),
         ("gpu0.mem_clock_mhz", "clocks.mem", 1.0, 0.05, 50),
         ("gpu0.temp_c", "temperature.gpu", 1.0, 0.0, 6),
         ("gpu0.util_pct", "utilization.gpu", 1.0, 0.0, 35))


def compare_telemetry(nvml: list[dict], smi: list[dict], apps: str, pid: int) -> dict[str, Any]:
    """Medians over the window, NVML (through opscope) against nvidia-smi, and the plausibility of
    what nvidia-smi cannot show (PCIe, throttle reasons, the engine process's own VRAM)."""
    out: dict[str, Any] = {"nvml_samples": len(nvml), "smi_samples": len(smi), "pairs": {}, "disagree": []}
    if len(nvml) < 10 or len(smi) < 5:
        out["disagree"].append(f"too few samples: NVML {len(nvml)}, nvidia-smi {len(smi)}")
        return out
    for series, field, scale, rel, absolute in PAIRS:
        a = median([r.get(series, float("nan")) * scale for r in nvml])
        b = median([r[field] for r in smi if isinstance(r.get(field), float)])
        out["pairs"][series] = {"nvml": a, "nvidia_smi": b}
        if not (a == a and b == b) or abs(a - b) > max(absolute, rel * abs(b)):
            out["disagree"].append(f"{series} {a:.4g} vs {field} {b:.4g}")
    for series in ("gpu0.pcie_tx_bytes_s", "gpu0.pcie_rx_bytes_s", "gpu0.clock_event_reasons", "gpu0.proc_mem_bytes"):
        out[series] = median([r.get(series, float("nan")) for r in nvml])
    used = {int(p): float(m) for p, m in (ln.split(",")[:2] for ln in apps.splitlines() if ln.count(",") >= 1)
            if p.strip().isdigit() and _is_float(m)}
    out["nvidia_smi_app_mib"] = used.get(pid)
    proc_mib = out["gpu0.proc_mem_bytes"] / 2**20
    if used.get(pid) is not None and not abs(proc_mib - used[pid]) <= max(256, 0.2 * used[pid]):
        out["disagree"].append(f"engine VRAM {proc_mib:.0f} MiB vs nvidia-smi's {used[pid]:.0f} MiB")
    if out["gpu0.pcie_tx_bytes_s"] != out["gpu0.pcie_tx_bytes_s"]:  # NaN: N/A all along
        out["disagree"].append("PCIe throughput read N/A")
    return out


def _is_float(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def energy(ctx: Ctx) -> dict[str, Any]:
    """Joules per token from NVML's total-energy counter, on the ~1B model's bfloat16 generation."""
    out = _generate(ctx, "large-f16", "--device", "cuda", "--dtype", "bfloat16", n=64, timeout_s=150)
    figures = _gen_figures(out)
    if out.get("energy_source") != "NVML total energy":
        raise fail(f"energy source is {out.get('energy_source')!r}, not NVML's total-energy counter", **figures)
    j = out.get("decode_j_per_token")
    if not j or not 0.01 <= j <= 100:
        raise fail(f"decode J/token {j} is implausible for a ~1B model", **figures)
    return figures


# name → (function, needs a GPU); in the order they run.
PLAN: list[tuple[str, Callable[[Ctx], dict[str, Any]], bool]] = [
    ("environment", environment, False),
    ("models-tiny", models_tiny, False),
    ("cpu-reference", cpu_reference, False),
    ("generate-cuda-float32", generate_cuda_float32, True),
    ("logits", logits, False),
    ("trace-clean", trace_clean, False),
    ("trace-leaky-norm", trace_leaky_norm, False),
    ("trace-slow-train", trace_slow_train, False),
    ("trace-fast-train", trace_fast_train, False),
    ("generate-nproc1", generate_nproc1, False),
    ("bench-bandwidth", bench_bandwidth, True),
    ("models-large", models_large, False),
    ("generate-large", generate_large, True),
    ("energy", energy, True),
    ("bench-llm-telemetry", llm_with_telemetry, True),
    ("bench-matmul", bench_matmul, True),
    ("bench-attention", bench_attention, True),
    ("store-compare", store_compare, False),
    ("bench-collectives", bench_collectives, False),
    ("bench-crossover", bench_crossover, True),
    ("generate-compile-decode", generate_compile_decode, True),
]
