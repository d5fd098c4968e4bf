"""The checks of the GPU check that load models: environment, models, generate, logits, trace.
Each is a function of the context returning its figures or raising CheckFailed; they drive the
`opscope` command as a user types it, and probe.py measures what no command prints (logits against
the CPU, the GPU's datasheet peaks). bench_checks.py holds the benchmarks, the run store and
telemetry; run.py's PLAN orders them all.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness import CheckFailed, Ctx, fail, which

HERE = Path(__file__).resolve().parent
PROBE = HERE / "probe.py"
PROMPT = "The quick brown fox jumps over the lazy dog"
TOKENS = 16
# ‖logits − CPU float32 logits‖ / ‖CPU float32 logits‖ on the tiny model, per variant. float32 allows
# TF32-class rounding; bf16 has 8 mantissa bits; int8/int4 re-quantize the weights (per channel;
# groups of 32), so their bound is the quantization's own error, not the kernels'.
LOGIT_TOLERANCE = {"float32": 2e-3, "float16": 1e-2, "bfloat16": 3e-2, "int8:bfloat16": 6e-2, "int4:bfloat16": 0.3}
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


SMI_FIELDS = (
    "name,driver_version,pstate,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.draw,"
    "power.limit,temperature.gpu,memory.used,memory.total,utilization.gpu,pcie.link.gen.current,"
    "pcie.link.width.current"
)
SMI_Q_KEYS = (
    "Product Name",
    "Driver Version",
    "CUDA Version",
    "VBIOS Version",
    "Persistence Mode",
    "Compute Mode",
    "Performance State",
    "Graphics",
    "SM",
    "Memory",
    "Total",
    "Used",
    "Power Draw",
    "Current Power Limit",
    "Max Power Limit",
    "GPU Current Temp",
    "Current",
    "Device Current",
    "Link Width",
    "Bus Id",
    "MIG Mode",
    "Addressing Mode",
    "SW Power Capping",
    "HW Slowdown",
    "SW Thermal Slowdown",
    "HW Thermal Slowdown",
    "Idle",
    "Fan Speed",
)


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
    for t in LARGE_TYPES:  # one process each: ~1 min apiece for the 1B, beside the checks that follow
        ctx.spawn(
            f"models-large-{t}", [ctx.python, str(PROBE), "models", str(ctx.scratch / "models"), large, "--types", t]
        )
    made = ctx.python_file(
        PROBE, "models", str(ctx.scratch / "models"), "tiny", "--types", "F16,Q8_0", timeout_s=120
    ).json()
    ctx.models.update({f"tiny-{t.lower()}": Path(f["path"]) for t, f in made["files"].items()})
    return made


LARGE_TYPES = ("F16", "Q8_0")


def models_large(ctx: Ctx) -> dict[str, Any]:
    made: dict[str, Any] = {}
    for t in LARGE_TYPES:
        proc = ctx.join(f"models-large-{t}", 300)
        if proc.code != 0:
            raise CheckFailed(f"writing the Llama-shaped {t} model failed: {proc.stderr.strip().splitlines()[-1:]}")
        one = proc.json()
        made = {**one, "files": {**made.get("files", {}), **one["files"]}}
    ctx.models.update({f"large-{t.lower()}": Path(f["path"]) for t, f in made["files"].items()})
    cfg = made["config"]
    ctx.shared["large_params"] = made["params"]
    ctx.shared["large_embed_params"] = cfg["vocab_size"] * cfg["hidden_size"] * (1 if cfg["tie_word_embeddings"] else 2)
    return made


# -- generate ---------------------------------------------------------------------------------------


def model_path(ctx: Ctx, model: str) -> str:
    if model not in ctx.models:
        raise CheckFailed(f"no {model} model (the check that writes it failed or did not run)")
    return str(ctx.models[model])


def _generate(ctx: Ctx, model: str, *flags: str, n: int = TOKENS, timeout_s: float = 180) -> dict[str, Any]:
    args = [
        "generate",
        "-m",
        model_path(ctx, model),
        "--temperature",
        "0",
        "--ignore-eos",
        "-n",
        str(n),
        "--json",
        *flags,
        PROMPT,
    ]
    return ctx.cli(*args, timeout_s=timeout_s).json()


def cpu_reference(ctx: Ctx) -> dict[str, Any]:
    out = _generate(ctx, "tiny-f16", "--device", "cpu", "--dtype", "float32", "--fastpath", "off")
    ctx.shared["reference_text"] = out["text"]
    return _gen_figures(out)


def _gen_figures(out: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "text",
        "generated_tokens",
        "ttft_ms",
        "prefill_tok_s",
        "decode_tok_s",
        "tpot_ms",
        "device",
        "dtype",
        "decode_j_per_token",
        "prefill_j_per_token",
        "energy_source",
    )
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
    out = _generate(ctx, "tiny-f16", "--device", "cuda", "--dtype", "float32", "--compile", "decode", timeout_s=240)
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
    res = ctx.python_file(
        PROBE,
        "logits",
        model_path(ctx, "tiny-f16"),
        "--device",
        device,
        "--variants",
        ",".join(variants),
        timeout_s=240,
    ).json()
    bad = []
    for r in res["results"]:
        r["tolerance"] = LOGIT_TOLERANCE[r["variant"]]
        if r.get("error") or not r["rel_error"] <= r["tolerance"]:
            bad.append(
                f"{r['variant']}: {r.get('error') or format(r['rel_error'], '.2e')} (tolerance {r['tolerance']:.0e})"
            )
    if bad:
        raise fail("logits off the CPU float32 reference: " + "; ".join(bad), **res)
    return res


def generate_large(ctx: Ctx) -> dict[str, Any]:
    """The ~1B model's speed in each GPU mode: TTFT, decode tok/s and MBU against the measured copy
    bandwidth (weights read once per token; the KV cache of 64 tokens is left out, < 1 %). Weight-only
    quantization stores the layers' linears in int8/int4; the embedding and output head stay 16-bit."""
    params, embed = ctx.shared.get("large_params"), ctx.shared.get("large_embed_params", 0)
    if not params:
        raise CheckFailed("no Llama-shaped model (the models-large check failed)")
    bw = ctx.shared.get("bandwidth_bytes_s")
    modes = {
        "float16": ("large-f16", ["--dtype", "float16"], 2.0),
        "bfloat16": ("large-f16", ["--dtype", "bfloat16"], 2.0),
        "q8_0-file bfloat16": ("large-q8_0", ["--dtype", "bfloat16"], 2.0),
        "int8 bfloat16": ("large-f16", ["--dtype", "bfloat16", "--quantize", "int8"], 1.0),
        "int4 bfloat16": ("large-f16", ["--dtype", "bfloat16", "--quantize", "int4"], 0.5),
    }
    figures, bad = {"params": params, "bandwidth_bytes_s": bw}, []
    for name, (model, flags, bytes_per_param) in modes.items():
        try:
            out = _generate(ctx, model, "--device", "cuda", *flags, n=64, timeout_s=150)
        except CheckFailed as e:
            bad.append(f"{name}: {e}")
            continue
        f = _gen_figures(out)
        f["weight_bytes"] = (params - embed) * bytes_per_param + embed * 2
        f["mbu"] = f["weight_bytes"] * out["decode_tok_s"] / bw if bw else None
        figures[name] = f
        ctx.shared.setdefault("generate_tpot_ms", {})[name] = f.get("tpot_ms")
        if not out.get("decode_tok_s") or (f["mbu"] is not None and f["mbu"] > RATIO_CEIL):
            bad.append(f"{name}: implausible decode rate {out.get('decode_tok_s')} tok/s (MBU {f['mbu']})")
    if bad:
        raise fail("; ".join(bad), **figures)
    return figures


def decode_steps(ctx: Ctx) -> dict[str, Any]:
    """Each decode step of a first request against the same request again and one of a new length
    (probe.py decode-steps), on the ~1B model in bfloat16. The first GPU runs' `generate` decoded
    7-10x slower than `bench llm`'s warmed-up requests: cuDNN's attention built a graph for every
    new KV length (docs/decisions/0010). A cost paid per new shape fails this check: as a slow
    median (every step of a first request), or as one slow step where a known request grows into
    new lengths (the new-length request's last steps)."""
    dtype = "float32" if ctx.dry else "bfloat16"
    res = ctx.python_file(
        PROBE, "decode-steps", model_path(ctx, "large-f16"), "--device", ctx.device, "--dtype", dtype, timeout_s=180
    ).json()
    runs = res["runs"]
    warm = runs["same again"]["median_ms"]
    # `generate`'s time per token (its own process, 64 tokens) over the probe's warm step: reported,
    # not judged (one process's cold steps and a shared host move it); far above 1 asks why
    res["generate_tpot_over_warm_step"] = {
        k: round(v / warm, 2) for k, v in ctx.shared.get("generate_tpot_ms", {}).items() if v and warm
    }
    slow = [f"{k} {r['median_ms']:.1f} ms" for k, r in runs.items() if k != "same again" and r["median_ms"] > 2 * warm]
    spike = runs["new length"]["max_after_first_ms"]
    if spike > 4 * warm and not ctx.dry:  # a shared 2-core CPU has spikes of its own
        slow.append(f"one step of the new length {spike:.1f} ms")
    if slow:
        raise fail(
            f"decode steps of new shapes are slow: {', '.join(slow)} against {warm:.1f} ms for the same request repeated",
            **res,
        )
    return res


# -- trace -----------------------------------------------------------------------------------------

REPO = HERE.parent.parent


def _bug_line(relpath: str, marker: str) -> str:
    """ "path:line" of the line holding ``marker``: what the report must point at."""
    for i, line in enumerate((REPO / relpath).read_text().splitlines(), 1):
        if marker in line:
            return f"{relpath}:{i}"
    raise CheckFailed(f"no line marked {marker!r} in {relpath}")


def _trace_model(ctx: Ctx, *flags: str) -> dict[str, Any]:
    device = "meta" if ctx.dry else "cuda"  # meta: an accelerator's op stream, simulated on the CPU
    return ctx.cli(
        "trace",
        "-m",
        model_path(ctx, "tiny-f16"),
        "--device",
        device,
        "--tokens",
        "4",
        "--fastpath",
        "off",
        "--json",
        "--no-save",
        *flags,
        "Hi",
        timeout_s=150,
    ).json()


def _trace_figures(r: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "target",
        "tokens",
        "ops",
        "ops_on_target_pct",
        "time_on_target_pct",
        "time_basis",
        "transfers",
        "syncs",
        "syncs_per_token",
        "simulated",
        "notes",
    )
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
        raise fail(
            f"expected D2H and H2D copies and syncs every token, got {per_token}, "
            f"{r.get('syncs_per_token')} syncs/token",
            **figures,
        )
    _device_times(ctx, r, figures)
    return figures


def _trace_script(ctx: Ctx, script: str) -> dict[str, Any]:
    report = ctx.scratch / f"trace-{Path(script).stem}.json"
    ctx.cli(
        "trace",
        "--target",
        ctx.device,
        "--report",
        str(report),
        "--no-save",
        "--",
        "python",
        script,
        "--steps",
        "6",
        "--device",
        ctx.device,
        timeout_s=150,
    )
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
