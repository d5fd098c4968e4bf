"""How far each lower-precision path moves the model's numbers — and how far llama.cpp moves them —
against the float32 reference, on real text (the question behind "is bf16 prefill correct enough?").

    .venv/bin/python benchmarks/precision.py [--tokens 512] [--text FILE] [--out precision.json]

Reference: the plain torch model in float32 (its logits are tested against Hugging Face
transformers in tests/test_reference_hf.py). Every candidate reads the same GGUF and the same token
ids, teacher-forced, in two modes: ``prefill`` (all tokens in one forward: the GEMM path) and
``decode`` (one token at a time from position 0: the matvec path). Per candidate and mode, over
the N positions: mean and 99th-percentile KL(ref ‖ candidate) in nats (llama.cpp's
``perplexity --kl-divergence`` measure), top-1 agreement, max |Δlogit|, and the perplexity of the
text under the candidate next to the reference's.
"""
from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
import time
from pathlib import Path

import torch

from engine.api import load
from engine.defaults import default_model_path

DEFAULT_TEXT = Path("/usr/share/common-licenses/GPL-3")  # stable natural English on Debian


def ours_logits(model, ids: list[int], mode: str) -> torch.Tensor:
    """Teacher-forced logits [N, V] of an engine model, all at once or one token at a time."""
    model.setup_cache(1, len(ids) + 1)
    with torch.inference_mode():
        if mode == "prefill":
            return model(torch.tensor([ids]), 0)[0].float()
        return torch.stack([model(torch.tensor([[t]]), i)[0, -1].float() for i, t in enumerate(ids)])


def llama_cpp_logits(path: Path, ids: list[int], mode: str, threads: int) -> torch.Tensor:
    from llama_cpp import Llama

    n = len(ids)
    llm = Llama(model_path=str(path), n_ctx=n + 16, n_batch=n, n_ubatch=n, n_threads=threads,
                n_threads_batch=threads, logits_all=True, verbose=False)
    if mode == "prefill":
        llm.eval(ids)
    else:
        for t in ids:
            llm.eval([t])
    return torch.from_numpy(llm.scores[:n].copy()).float()


def compare(ref: torch.Tensor, got: torch.Tensor, ids: list[int]) -> dict:
    lr, lg = torch.log_softmax(ref.double(), -1), torch.log_softmax(got.double(), -1)
    kl = (lr.exp() * (lr - lg)).sum(-1)
    nxt = torch.tensor(ids[1:])
    nll = lambda lp: -lp[:-1].gather(-1, nxt[:, None]).mean().item()  # noqa: E731
    return {"kl_mean": kl.mean().item(), "kl_p99": kl.quantile(0.99).item(), "kl_max": kl.max().item(),
            "top1_agree": (ref.argmax(-1) == got.argmax(-1)).double().mean().item(),
            "max_abs_dlogit": (ref - got).abs().max().item(),
            "ppl": float(torch.tensor(nll(lg)).exp()), "ppl_ref": float(torch.tensor(nll(lr)).exp())}


def candidates(path: Path, ids: list[int], threads: int):
    """(name, modes, logits(mode)) for every candidate that can run here."""
    def engine(**kw):
        def run(mode):
            lm = load(str(path), threads=threads, **kw)
            return ours_logits(lm.model, ids, mode)
        return run

    yield "opscope fast path (default: f32)", ("prefill", "decode"), engine()
    yield "opscope fast path prefill_dtype=bf16", ("prefill",), engine(fastpath="prefill_dtype=bf16")
    yield "opscope fast path activations=q8", ("decode",), engine(fastpath="activations=q8")
    yield "opscope plain torch bfloat16", ("prefill", "decode"), engine(fastpath="off", dtype="bfloat16")
    yield "opscope plain torch --quantize int8", ("prefill",), engine(quantize="int8")
    yield "opscope plain torch --quantize int4", ("prefill",), engine(quantize="int4")
    try:
        import llama_cpp  # noqa: F401

        yield "llama.cpp (llama-cpp-python)", ("prefill", "decode"), \
            lambda mode: llama_cpp_logits(path, ids, mode, threads)
    except ImportError:
        logging.warning("llama-cpp-python is not installed: llama.cpp is left out")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--text", type=Path, default=DEFAULT_TEXT)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/precision.json"))
    a = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if not a.text.is_file():
        print(f"error: text file {a.text} not found; pass --text FILE", file=sys.stderr)
        return 2
    path = default_model_path()
    ref_lm = load(str(path), fastpath="off", threads=a.threads)
    ids = ref_lm.tokenizer.encode(a.text.read_text(), add_special_tokens=False)[:a.tokens]
    ref = {m: ours_logits(ref_lm.model, ids, m) for m in ("prefill", "decode")}
    rows = [{"candidate": "reference (plain torch float32)", "mode": "decode",
             **compare(ref["prefill"], ref["decode"], ids)}]
    for name, modes, run in candidates(path, ids, a.threads):
        for mode in modes:
            t0 = time.perf_counter()
            rows.append({"candidate": name, "mode": mode, **compare(ref[mode], run(mode), ids),
                         "seconds": round(time.perf_counter() - t0, 1)})
            print(_line(rows[-1]), flush=True)
    print(f"\n{len(ids)} tokens of {a.text}; KL in nats, reference perplexity {rows[0]['ppl_ref']:.3f}")
    print(_line(rows[0]))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"model": str(path), "text": str(a.text), "tokens": len(ids),
                                 "threads": a.threads, "torch": torch.__version__,
                                 "machine": platform.processor() or platform.machine(), "rows": rows}, indent=1))
    return 0


def _line(r: dict) -> str:
    return (f"{r['candidate']:<42} {r['mode']:<8} KL mean {r['kl_mean']:.2e} p99 {r['kl_p99']:.2e} "
            f"max {r['kl_max']:.2e}  top-1 {r['top1_agree']:.3f}  max|Δlogit| {r['max_abs_dlogit']:.3f}  "
            f"ppl {r['ppl']:.3f}")


if __name__ == "__main__":
    sys.exit(main())
