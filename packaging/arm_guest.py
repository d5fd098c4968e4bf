"""Runs inside another CPython with torch: an aarch64 one under qemu-user (packaging/arm_check.py)
or Debian 13's CPython 3.13 (packaging/python_check.py). Loads the kernels through the engine's own
loader, which must pick the asked-for variant from the prebuilt folder (the kernel cache is empty;
nothing is compiled), and checks each op against the references the host computed
(gguf.quants.dequantize, float64 numpy; for int8 activations the int8-rounded x). One line per case;
exit status 1 when the loader took another road or any value is out of tolerance. A variant without
int8 kernels (x86-64's baseline) has its int8 checks skipped, said once. Given a GGUF model, it
then loads it through the engine (the fast path as a user gets it: the fused decode step, the prefill
GEMMs), exact and with int8 activations (SPECS), and prints each greedy continuation of PROMPT as a
``generate: {json}`` line, which the host compares with its own.

    python arm_guest.py INPUTS.pt VARIANT [MODEL.gguf]
"""

import json
import platform
import sys
import time

# packaging/cpu_models_check.py's generation too. 16 tokens, so that the prompt goes through the
# prefill GEMMs (the int8 one with activations=q8), not the decode step; no near-tie in its 16 greedy
# tokens, by either mode, on x86's avx512-vnni and avx2 (whose sums are ordered differently), where
# other prompts tried had one (a continuation then legitimately differs).
PROMPT = "Water boils at 100 degrees Celsius at sea level. Water freezes at"
TOKENS = 16
SPECS = ("auto", "activations=q8")  # exact float32 (the default), int8 activations

REL = 1e-5  # |y - y64| <= REL * (|x| @ |W|^T), elementwise: exact weights, float32 sums


def worst(y, ref, bound) -> float:
    return float(((y.double() - ref).abs() / bound.clamp_min(1e-30)).max())


def main(inputs: str, variant: str) -> int:
    t0 = time.time()
    import torch

    print(
        f"guest: {platform.machine()}, Python {platform.python_version()}, torch {torch.__version__} "
        f"(imported in {time.time() - t0:.0f} s)",
        flush=True,
    )
    from opscope.engine.fastpath.kernels import build, variants

    origin = build.library_origin()
    build.load_kernels()
    print(f"loader: {variants.reason(variants.chosen())}; {origin}", flush=True)
    if build.loaded_variant() != variant or not origin.startswith("prebuilt:"):
        print(f"FAILED: expected the prebuilt {variant} library, got {build.loaded_variant()} ({origin})")
        return 1
    torch.set_num_threads(2)
    failed = 0
    int8 = any(torch.ops.opscope.raw_has_q8(t) for t in range(42)) or torch.ops.opscope.has_int8_soa()
    if not int8:
        print(f"{variant} has no int8 kernels: its int8 checks are skipped", flush=True)
    for case in torch.load(inputs, weights_only=True):
        w = case["weight"]
        for op, x, ref, bound in case["checks"]:
            if op.endswith("_q8") and not int8:
                continue
            if op.startswith("qlinear"):  # one row: the fused dequantize-matvec (act_mode 1: int8 activations)
                act_mode = 1 if op == "qlinear_q8" else 0
                y = torch.ops.opscope.qlinear(x, w["qs"], w["d"], w["m"], w["qtype"], act_mode, 8, torch.float32)
            elif op == "qgemm_q8":  # many rows, int8 activations: the int8 prefill GEMM (every type on NEON)
                n = ref.shape[1] // 16 * 16  # its panels take rows in 16s: the first 32 of the 37
                w16 = {key: v[:n] if isinstance(v, torch.Tensor) and v.dim() else v for key, v in w.items()}
                ref, bound = ref[:, :n], bound[:, :n]
                if torch.ops.opscope.int8_prefill_group(w["qtype"], x.shape[1], n) <= 0:
                    print(f"{case['type']:7s} {case['layout']:4s} {op:10s}: FAILED: no int8 prefill GEMM", flush=True)
                    failed += 1
                    continue
                y = torch.ops.opscope.qlinear(x, w16["qs"], w16["d"], w16["m"], w["qtype"], 1, 8, torch.int8)
            else:  # many rows: the prefill GEMM
                y = torch.ops.opscope.qgemm(x, w["qs"], w["d"], w["m"], w["qtype"])
                failed += not bf16_agrees(torch, case, w, x)
            err = worst(y, ref, bound)
            ok = err <= REL
            failed += not ok
            print(
                f"{case['type']:7s} {case['layout']:4s} {op:10s} rows {x.shape[0]:3d}: worst {err:.2e} x bound "
                f"{'ok' if ok else 'FAILED'}",
                flush=True,
            )
    print(f"{'all ops agree' if not failed else f'{failed} checks failed'} (tolerance {REL:g} x bound)")
    return 1 if failed else 0


def generate(model: str, spec: str) -> dict:
    """The engine's greedy continuation of PROMPT on ``model`` (fast path ``spec``, 2 threads), and
    the path it took: the kernels and the decode step's class (FusedStep: the C++ DecodeModel)."""
    from opscope.engine.api import load
    from opscope.engine.generation.config import GenerationConfig
    from opscope.engine.generation.events import Finished

    t0 = time.time()
    lm = load(model, threads=2, fastpath=spec)
    done = [e for e in lm.generate(PROMPT, GenerationConfig(max_tokens=TOKENS)) if isinstance(e, Finished)][-1]
    step = type(getattr(lm.model, "decode_step", None)).__name__
    d = lm.describe()
    return {"spec": spec, "text": done.text, "cpu_kernels": d["cpu_kernels"], "decode_step": step,
            "s": round(time.time() - t0)}  # fmt: skip


def bf16_agrees(torch, case: dict, w: dict, x) -> bool:
    """The bf16 prefill GEMM (prefill_dtype=bf16) equals torch's own bf16 GEMM of the float32
    weights the exact GEMM used, rounded by torch: the panels' rounding to bf16 is torch's, bit for
    bit, where bf16 GEMMs are native. Elsewhere (an AVX2 CPU: oneDNN's emulated bf16 GEMM sums a
    panel in another order than the whole) within one bf16 rounding of torch's."""
    from opscope.engine.fastpath.kernels import build

    # the exact product's weights: rows of the float32 GEMM of an identity (exact: one term per output)
    dense = torch.ops.opscope.qgemm(torch.eye(x.shape[1]), w["qs"], w["d"], w["m"], w["qtype"]).t()
    y = torch.ops.opscope.qlinear(x, w["qs"], w["d"], w["m"], w["qtype"], 0, 8, torch.bfloat16)
    t = torch.mm(x.bfloat16(), dense.bfloat16().t()).float()
    if build.native_bf16():
        ok, said = torch.equal(y, t), "equals torch"
    else:  # a bf16 ulp is at most 2**-7 of the value
        ok, said = bool(((y - t).abs() <= 2.0**-7 * t.abs()).all()), "within one bf16 rounding of torch"
    print(f"{case['type']:7s} {case['layout']:4s} {'qgemm_bf16':10s} rows {x.shape[0]:3d}: "
          f"{said if ok else 'FAILED: differs from torch'}", flush=True)  # fmt: skip
    return ok


if __name__ == "__main__":
    rc = main(sys.argv[1], sys.argv[2])
    for spec in SPECS if len(sys.argv) > 3 else ():
        print(f"generate: {json.dumps(generate(sys.argv[3], spec))}", flush=True)
    sys.exit(rc)
