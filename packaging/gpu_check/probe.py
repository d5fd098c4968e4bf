"""Two measurements the CLI does not print, run by the GPU check in its prepared environment:

    python probe.py info                                   # torch, CUDA, the GPU, its datasheet peaks
    python probe.py logits MODEL --device cuda --variants float32,bfloat16,int4:bfloat16
    python probe.py models DIR tiny|small|1b [--types F16,Q8_0]  # GGUFs written on the spot
    python probe.py decode-steps MODEL --device cuda --dtype bfloat16 [--tokens 48]

``logits`` compares one forward pass over a fixed prompt with the CPU float32 reference of the same
file (unquantized: a quantized variant's bound includes its own rounding):
‖out − ref‖ / ‖ref‖ over all logits, and how often the argmax agrees. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys

PROMPT_IDS = [1, 17, 42, 99, 7, 3, 250, 64, 128, 5, 11, 200, 31, 77, 150, 9]


def info() -> dict:
    import torch

    out = {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "nccl": _nccl_version(),
    }
    if not torch.cuda.is_available():
        return out
    p = torch.cuda.get_device_properties(0)
    out.update(
        device=p.name,
        capability=f"{p.major}.{p.minor}",
        sms=p.multi_processor_count,
        memory_bytes=p.total_memory,
        l2_bytes=getattr(p, "L2_cache_size", None),
        uuid=str(getattr(p, "uuid", "")),
        datasheet=_datasheet(),
    )
    return out


def _nccl_version() -> str | None:
    try:
        import torch.cuda.nccl as nccl

        v = nccl.version()
        return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except Exception:  # a CPU build of torch has no NCCL
        return None


def _datasheet() -> dict:
    from opscope.engine.bench.ceilings import peaks

    out = {}
    for kind, dtype in (("matmul", "float32"), ("matmul", "bfloat16"), ("matmul", "float16"), ("bandwidth", None)):
        peak = peaks.theoretical("cuda", kind, dtype)
        out[f"{kind}_{dtype}" if dtype else kind] = peak.as_dict() if peak else None
    return out


def logits(model: str, device: str, variants: list[str]) -> dict:
    """Each variant ("dtype" or "quantize:dtype") on ``device`` against the CPU float32 run."""
    import torch
    from opscope.engine.api import load

    ref_lm = load(model, device="cpu", dtype="float32", fastpath="off")
    ids = [i % ref_lm.config.vocab_size for i in PROMPT_IDS]
    ref = ref_lm.logits(ids).double()
    del ref_lm
    results = []
    for variant in variants:
        quantize, _, dtype = variant.rpartition(":")
        try:
            lm = load(model, device=device, dtype=dtype, fastpath="off", quantize=quantize or "off")
            got = lm.logits(ids).double().cpu()
            del lm
        except Exception as e:  # one variant's failure is that variant's result, not the probe's
            results.append({"variant": variant, "error": f"{type(e).__name__}: {e}"[:400]})
            continue
        finite = bool(torch.isfinite(got).all())
        results.append(
            {
                "variant": variant,
                "finite": finite,
                "rel_error": float((got - ref).norm() / ref.norm()) if finite else float("inf"),
                "argmax_agreement": float((got.argmax(-1) == ref.argmax(-1)).double().mean()),
            }
        )
    return {"reference": "cpu float32, fastpath off", "device": device, "positions": len(ids), "results": results}


# Llama-shaped configs (Hugging Face names) for engine.testing.gguf_writer: "1b" is Llama-3.2-1B's
# shape with a 32k vocabulary (1.1e9 parameters); "small" the dry run's stand-in for it.
SHAPES = {
    "tiny": dict(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
        max_position_embeddings=1024,
    ),
    "small": dict(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        vocab_size=1024,
        max_position_embeddings=1024,
    ),
    "1b": dict(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        vocab_size=32000,
        max_position_embeddings=2048,
    ),
}


def models(out_dir: str, shape: str, types: list[str]) -> dict:
    import time
    from pathlib import Path

    from opscope.engine.testing.gguf_writer import hf_config, tensor_shapes, write_gguf

    cfg = hf_config("llama", **SHAPES[shape])
    params = sum(_numel(s) for s in tensor_shapes(cfg).values())
    written = {}
    for t in types:
        t0 = time.monotonic()
        path = write_gguf(Path(out_dir) / f"{shape}-{t.lower()}.gguf", cfg, types=t, name=f"opscope-gpu-check-{shape}")
        written[t] = {"path": str(path), "bytes": path.stat().st_size, "write_s": round(time.monotonic() - t0, 2)}
    return {"shape": shape, "params": params, "config": cfg, "files": written}


def decode_steps(model: str, device: str, dtype: str, tokens: int) -> dict:
    """Each decode step's time, in one process: a first request, the same request again, one with a
    new prompt length (new KV lengths). A cost per new shape shows as slow first and new-length
    requests: cuDNN's attention graphs did, 75 ms a step against 7 (docs/decisions/0010)."""
    import statistics

    import torch
    from opscope.engine.api import load
    from opscope.engine.generation.config import GenerationConfig
    from opscope.engine.generation.events import Token

    lm = load(model, device=device, dtype=dtype, fastpath="off")
    cfg = GenerationConfig(max_tokens=tokens, ignore_eos=True, reuse_prefix=False)

    def one(ids: list[int]) -> dict:
        stamps = [ev.t_ns for ev in lm.generate(ids, cfg) if isinstance(ev, Token)]
        ms = [(b - a) / 1e6 for a, b in zip(stamps, stamps[1:], strict=False)]
        return {
            "median_ms": round(statistics.median(ms), 3),
            "min_ms": round(min(ms), 3),
            "max_ms": round(max(ms), 3),
            "max_after_first_ms": round(max(ms[1:]), 3),  # a new shape's setup, past the first step
            "first_ms": [round(x, 2) for x in ms[:4]],
            "steps": len(ms),
            "sm_clock_mhz": _sm_clock(device),
        }

    runs = {
        "first": one(PROMPT_IDS),
        "same again": one(PROMPT_IDS),
        "new length": one(PROMPT_IDS + PROMPT_IDS[:5]),
    }
    out: dict = {"device": device, "dtype": dtype, "runs": runs}
    if device.startswith("cuda"):
        out["cudnn_sdp_enabled"] = torch.backends.cuda.cudnn_sdp_enabled()  # torch's flag outside a request
    return out


def _sm_clock(device: str) -> int | None:
    """The SM clock now (NVML), right after a request: a decode that leaves the GPU idle between
    small kernels may not raise it from idle."""
    if not device.startswith("cuda"):
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetClockInfo(pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.NVML_CLOCK_SM))
    except Exception:  # no NVML: the figure is left out, the step times still say what they say
        return None


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="probe.py")
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("info")
    lg = sub.add_parser("logits")
    lg.add_argument("model")
    lg.add_argument("--device", default="cuda")
    lg.add_argument("--variants", default="float32", help="comma-separated: dtype or quantize:dtype")
    md = sub.add_parser("models")
    md.add_argument("dir")
    md.add_argument("shape", choices=tuple(SHAPES))
    md.add_argument("--types", default="F16,Q8_0")
    ds = sub.add_parser("decode-steps")
    ds.add_argument("model")
    ds.add_argument("--device", default="cuda")
    ds.add_argument("--dtype", default="bfloat16")
    ds.add_argument("--tokens", type=int, default=48)
    a = ap.parse_args(argv)
    if a.cmd == "info":
        result = info()
    elif a.cmd == "logits":
        result = logits(a.model, a.device, a.variants.split(","))
    elif a.cmd == "decode-steps":
        result = decode_steps(a.model, a.device, a.dtype, a.tokens)
    else:
        result = models(a.dir, a.shape, a.types.split(","))
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
