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

``--types Q4_K_M,IQ4_XS|all`` instead checks real files of every GGUF type (the embedded model
re-quantized by llama.cpp's llama-quantize, cached as benchmarks/gguf_types.py caches them), per
type: 32 greedy tokens from a chat prompt, the logits of the prompt's last position and those of
the decode step after each generated token (teacher-forced), of OpScope's fast path against
Hugging Face transformers loading the same file (gguf-py dequantizes it, float32) and against
OpScope's own plain-torch (eager) path; then, teacher-forced on ``--text``, the top-1
agreement and mean KL(llama.cpp ‖ OpScope) against llama.cpp's own log-probabilities on that file
(``llama-perplexity --kl-divergence-base``: its second half of every ``--ctx`` chunk, stored as
16-bit codes over a 16-nat range, KL summed over the tokens above -16 nats as llama.cpp's own
``--kl-divergence`` does), with transformers' figure beside it: llama.cpp quantizes activations
(Q8 blocks) in its matmuls, so the gap to it is llama.cpp's, not the file's. Markdown table on
stdout and in ``--out`` (.md beside the .json).
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from opscope.engine.api import load
from opscope.engine.core.defaults import default_model_path

DEFAULT_TEXT = Path("/usr/share/common-licenses/GPL-3")  # stable natural English on Debian
DEFAULT_OUT = Path("benchmarks/results/precision.json")
DEFAULT_TYPES_OUT = Path("benchmarks/results/precision_types.json")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # gguf_types: the type list, llama-quantize cache


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
    llm = Llama(
        model_path=str(path),
        n_ctx=n + 16,
        n_batch=n,
        n_ubatch=n,
        n_threads=threads,
        n_threads_batch=threads,
        logits_all=True,
        verbose=False,
    )
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
    return {
        "kl_mean": kl.mean().item(),
        "kl_p99": kl.quantile(0.99).item(),
        "kl_max": kl.max().item(),
        "top1_agree": (ref.argmax(-1) == got.argmax(-1)).double().mean().item(),
        "max_abs_dlogit": (ref - got).abs().max().item(),
        "ppl": float(torch.tensor(nll(lg)).exp()),
        "ppl_ref": float(torch.tensor(nll(lr)).exp()),
    }


def candidates(path: Path, ids: list[int], threads: int):
    """(name, modes, logits(mode)) for every candidate that can run here."""

    def engine(**kw):
        def run(mode):
            lm = load(str(path), threads=threads, **kw)
            return ours_logits(lm.model, ids, mode)

        return run

    yield "opscope fast path (default: f32)", ("prefill", "decode"), engine()
    yield "opscope fast path prefill_dtype=bf16", ("prefill",), engine(fastpath="prefill_dtype=bf16")
    # q8's prefill: int8 GEMMs where the kernels have them (AVX-512 VNNI), else bf16 where native
    yield "opscope fast path activations=q8", ("prefill", "decode"), engine(fastpath="activations=q8")
    q8_bf16 = "activations=q8,prefill_dtype=bf16"
    yield f"opscope fast path {q8_bf16}", ("prefill",), engine(fastpath=q8_bf16)
    yield "opscope plain torch bfloat16", ("prefill", "decode"), engine(fastpath="off", dtype="bfloat16")
    yield "opscope plain torch --quantize int8", ("prefill",), engine(quantize="int8")
    yield "opscope plain torch --quantize int4", ("prefill",), engine(quantize="int4")
    try:
        import llama_cpp  # noqa: F401

        yield (
            "llama.cpp (llama-cpp-python)",
            ("prefill", "decode"),
            lambda mode: llama_cpp_logits(path, ids, mode, threads),
        )
    except ImportError:
        logging.warning("llama-cpp-python is not installed: llama.cpp is left out")


# ---------------------------------------------------------------- --types: real files of every type

CHAT_PROMPT = [{"role": "user", "content": "Write a short poem about the sea."}]
GREEDY_TOKENS = 32


@dataclass(frozen=True)
class LlamaCppLogprobs:
    """llama.cpp's log-probabilities over a text, as ``llama-perplexity --kl-divergence-base`` stores
    them: per chunk of ``n_ctx`` tokens, positions ``first`` .. ``n_ctx - 2`` (``first = n_ctx // 2``)."""

    n_ctx: int
    tokens: np.ndarray  # [chunks, n_ctx] int32, as in the text (before any BOS substitution)
    logprobs: torch.Tensor  # [chunks, n_ctx - 1 - first, vocab] float64, decoded from 16-bit codes
    first: int


def read_kld_base(path: Path) -> LlamaCppLogprobs:
    """Parse llama-perplexity's logits file: "_logits_", int32 n_ctx, n_vocab, n_chunk, the tokens, then
    per kept position ``nv = 2*ceil(n_vocab/2) + 4`` uint16: two float32 (scale, min log-prob) and
    a code per token (log p = scale * code + min)."""
    raw = path.read_bytes()
    if raw[:8] != b"_logits_":
        raise ValueError(f"{path}: not a llama-perplexity logits file")
    n_ctx, n_vocab, n_chunk = (int(v) for v in np.frombuffer(raw, np.int32, 3, 8))
    off = 20
    tokens = np.frombuffer(raw, np.int32, n_ctx * n_chunk, off).reshape(n_chunk, n_ctx)
    off += tokens.nbytes
    first, nv = n_ctx // 2, 2 * ((n_vocab + 1) // 2) + 4
    rows = n_ctx - 1 - first
    codes = np.frombuffer(raw, np.uint16, n_chunk * rows * nv, off).reshape(n_chunk, rows, nv)
    if off + codes.nbytes != len(raw):
        raise ValueError(f"{path}: {len(raw)} bytes, expected {off + codes.nbytes}")
    head = codes[..., :4].copy().view(np.float32)  # [.., 2]: scale, min log-prob
    lp = torch.from_numpy(codes[..., 4 : 4 + n_vocab].astype(np.float64))
    lp = lp * torch.from_numpy(head[..., :1].astype(np.float64)) + torch.from_numpy(head[..., 1:2].astype(np.float64))
    return LlamaCppLogprobs(n_ctx, tokens, lp, first)


def llama_cpp_logprobs(
    path: Path, text: Path, n_ctx: int, chunks: int, threads: int = 1, tools: Path | None = None
) -> LlamaCppLogprobs:
    """Run llama.cpp's own ``llama-perplexity`` on ``path`` over ``text`` and read its log-probs."""
    from gguf_types import TOOLS

    exe = (tools or TOOLS) / "llama-perplexity"
    with tempfile.TemporaryDirectory(prefix="opscope-kld-") as tmp:
        out = Path(tmp) / "base.bin"
        argv = [
            str(exe),
            "-m",
            str(path),
            "-f",
            str(text),
            "-c",
            str(n_ctx),
            "-b",
            str(n_ctx),
            "--chunks",
            str(chunks),
            "-t",
            str(threads),
            "--kl-divergence-base",
            str(out),
        ]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        if done.returncode != 0 or not out.is_file():
            raise RuntimeError(f"llama-perplexity failed on {path.name}: {done.stderr.strip().splitlines()[-3:]}")
        return read_kld_base(out)


def teacher_forced_logprobs(forward, base: LlamaCppLogprobs, bos_id: int | None) -> torch.Tensor:
    """Log-probs [chunks, rows, V] of ``forward(ids) -> logits [T, V]`` on the chunks llama.cpp saw
    (its first token replaced by BOS where the vocabulary adds one, as llama-perplexity does)."""
    out = []
    for chunk in base.tokens:
        ids = chunk.tolist()
        if bos_id is not None:
            ids[0] = bos_id
        logits = forward(ids)[base.first : base.n_ctx - 1]
        out.append(torch.log_softmax(logits.double(), -1))
    return torch.stack(out)


def against_llama_cpp(base: LlamaCppLogprobs, ours: torch.Tensor) -> dict:
    """KL(llama.cpp ‖ ours) per position, as llama-perplexity --kl-divergence sums it (base tokens
    above -16 nats), and top-1 agreement."""
    lb = base.logprobs
    kl = torch.where(lb > -16, lb.exp() * (lb - ours), 0.0).sum(-1).flatten()
    top1 = (lb.argmax(-1) == ours.argmax(-1)).double().mean().item()
    return {"kl_mean": kl.mean().item(), "kl_max": kl.max().item(), "top1_agree": top1, "positions": kl.numel()}


class HFReference:
    """Hugging Face transformers' model of the GGUF architecture, float32, its weights read from
    each file by transformers' own GGUF loader (``load_gguf_checkpoint``: gguf-py dequantizes,
    transformers' tensor processors undo llama.cpp's Q/K permutation). The config is read once
    (every file here is the same model); reading a file's tensors costs about 10 s (gguf-py's
    reader parses the 49k-entry vocabulary each time)."""

    def __init__(self, path: Path):
        import transformers

        transformers.logging.set_verbosity_error()
        cfg = transformers.AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
        self.model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
        self.tied = bool(cfg.tie_word_embeddings)

    def load_file(self, path: Path) -> None:
        from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

        tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=self.model)["tensors"]
        res = self.model.load_state_dict(tensors, strict=False)
        allowed = {"lm_head.weight"} if self.tied else set()
        if set(res.missing_keys) - allowed or res.unexpected_keys:
            raise RuntimeError(
                f"transformers read {path.name} with missing {res.missing_keys}, unexpected {res.unexpected_keys}"
            )
        if self.tied:
            self.model.tie_weights()

    def logits(self, ids: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            return self.model(torch.tensor([ids])).logits[0].float()

    def greedy(self, ids: list[int], n: int = GREEDY_TOKENS) -> list[int]:
        """Transformers' own greedy loop with its own KV cache; EOS not special."""
        out, got = None, []
        with torch.inference_mode():
            x = torch.tensor([ids])
            for _ in range(n):
                out = self.model(x, past_key_values=out.past_key_values if out else None, use_cache=True)
                got.append(int(out.logits[0, -1].argmax()))
                x = torch.tensor([[got[-1]]])
        return got


def ours_greedy(lm, ids: list[int], n: int = GREEDY_TOKENS) -> list[int]:
    from opscope.engine.generation.events import Token
    from opscope.engine.generation.generate import GenerationConfig

    return [
        e.token_id for e in lm.generate(ids, GenerationConfig(max_tokens=n, ignore_eos=True)) if isinstance(e, Token)
    ]


def decode_logits(lm, prompt: list[int], steps: list[int]) -> torch.Tensor:
    """Logits [len(steps), V] of the decode path: ``prompt`` prefilled, then ``steps`` fed one token
    at a time through the model's decode step (the fused one on the fast path), teacher-forced;
    row i is the prediction after ``steps[i]``, i.e. for position len(prompt) + i."""
    model = lm.model
    model.setup_cache(1, len(prompt) + len(steps) + 1)
    with torch.inference_mode():
        model(torch.tensor([prompt]), 0, last_only=True)
        return torch.stack([model(torch.tensor([[t]]), len(prompt) + i)[0, -1].float() for i, t in enumerate(steps)])


def chat_prompt_ids(lm) -> list[int]:
    return lm.tokenizer.encode(lm.tokenizer.apply_chat_template(CHAT_PROMPT), add_special_tokens=False)


def same_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens two greedy runs share."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def check_type(
    kind: str, path: Path, hf: HFReference | None, text: Path, n_ctx: int, chunks: int, threads: int
) -> dict:
    """One real file: OpScope's fast path against transformers, its own eager path and llama.cpp."""
    from gguf_types import tensor_types

    row: dict = {"type": kind, "file": path.name, "tensor_types": tensor_types(path)}
    t0 = time.perf_counter()
    fast = load(str(path), threads=threads)
    ids = chat_prompt_ids(fast)
    toks, last = ours_greedy(fast, ids), fast.logits(ids)[-1]
    dec = decode_logits(fast, ids, toks)
    eager = load(str(path), fastpath="off", threads=threads)
    e_toks, e_last = ours_greedy(eager, ids), eager.logits(ids)[-1]
    row |= {
        "eager_same_tokens": same_prefix(toks, e_toks),
        "eager_max_dlogit": (last - e_last).abs().max().item(),
        "eager_decode_max_dlogit": (dec - decode_logits(eager, ids, toks)).abs().max().item(),
    }
    del eager
    bos = fast.tokenizer.bos_id if fast.tokenizer.add_bos else None
    base = llama_cpp_logprobs(path, text, n_ctx, chunks, threads)
    row["llama_cpp"] = against_llama_cpp(base, teacher_forced_logprobs(fast.logits, base, bos))
    if hf is not None:
        hf.load_file(path)
        h_toks, h_last = hf.greedy(ids), hf.logits(ids)[-1]
        full = hf.logits(ids + toks)[len(ids) :]  # what transformers predicts after each decoded token
        row |= {
            "hf_same_tokens": same_prefix(toks, h_toks),
            "hf_max_dlogit": (last - h_last).abs().max().item(),
            "hf_decode_max_dlogit": (dec - full).abs().max().item(),
            "max_abs_logit": h_last.abs().max().item(),
            "hf_vs_llama_cpp": against_llama_cpp(base, teacher_forced_logprobs(hf.logits, base, bos)),
        }
    row["seconds"] = round(time.perf_counter() - t0, 1)
    return row


def types_table(rows: list[dict]) -> str:
    head = (
        "| type | tensor types in the file | greedy 32 = transformers | max \\|Δlogit\\| vs transformers: prompt, decode "
        "| eager: greedy 32 =, max \\|Δlogit\\| prompt, decode | vs llama.cpp: top-1, mean KL (max) "
        "| transformers vs llama.cpp: top-1, mean KL |\n" + "|---" * 7 + "|"
    )
    lines = [head]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['type']} | | {r['error']} | | | | |")
            continue
        mix = ", ".join(f"{k} {n}" for k, n in r["tensor_types"].items() if k != "F32")
        lc = r["llama_cpp"]
        hf = (
            (f"{r['hf_same_tokens']}/{GREEDY_TOKENS}", f"{r['hf_max_dlogit']:.1e}, {r['hf_decode_max_dlogit']:.1e}")
            if "hf_same_tokens" in r
            else ("not run", "")
        )
        hl = r.get("hf_vs_llama_cpp")
        hl = f"{hl['top1_agree']:.3f}, {hl['kl_mean']:.1e}" if hl else ""
        lines.append(
            f"| {r['type']} | {mix} | {hf[0]} | {hf[1]} | {r['eager_same_tokens']}/{GREEDY_TOKENS}, "
            f"{r['eager_max_dlogit']:.1e}, {r['eager_decode_max_dlogit']:.1e} | {lc['top1_agree']:.3f}, {lc['kl_mean']:.1e} "
            f"({lc['kl_max']:.1e}) | {hl} |"
        )
    return "\n".join(lines)


def types_main(a) -> int:
    from gguf_types import CACHE, TYPES, quantize

    kinds = list(TYPES) if a.types == "all" else [k.strip() for k in a.types.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in TYPES]
    if unknown:
        print(f"error: unknown type(s) {unknown}; choose from {', '.join(TYPES)} or all", file=sys.stderr)
        return 2
    src = default_model_path()
    hf = None if a.no_hf else HFReference(src)
    rows = []
    for kind in kinds:
        t0 = time.perf_counter()
        path = quantize(src, kind, CACHE, a.threads)
        try:
            rows.append(
                check_type(kind, path, hf, a.text, a.ctx, a.chunks, a.threads)
                | {"quantize_s": round(time.perf_counter() - t0, 1)}
            )
        except Exception as e:
            logging.exception("%s failed", kind)
            rows.append({"type": kind, "error": f"{type(e).__name__}: {str(e).splitlines()[0]}"})
        print(types_table(rows[-1:]).splitlines()[-1], flush=True)
    table = types_table(rows)
    note = (
        f"\n\nSmolLM2-135M-Instruct ({src.name}) re-quantized by llama-quantize --allow-requantize; "
        f"prompt {CHAT_PROMPT[0]['content']!r} (chat template), {GREEDY_TOKENS} greedy tokens; "
        f"llama.cpp: llama-perplexity -c {a.ctx} --chunks {a.chunks} on {a.text.name}, KL(llama.cpp ‖ x) "
        f"in nats over the second half of each chunk; transformers {_version('transformers')}, "
        f"gguf {_version('gguf')}, torch {torch.__version__}."
    )
    print("\n" + table + note)
    out = a.out if a.out != DEFAULT_OUT else DEFAULT_TYPES_OUT
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "rows": rows,
                "text": str(a.text),
                "ctx": a.ctx,
                "chunks": a.chunks,
                "threads": a.threads,
                "machine": platform.processor() or platform.machine(),
            },
            indent=1,
        )
    )
    out.with_suffix(".md").write_text(table + note + "\n")
    return 0 if all("error" not in r for r in rows) else 1


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "not installed"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--text", type=Path, default=DEFAULT_TEXT)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help=f"JSON results (default {DEFAULT_OUT}; with --types {DEFAULT_TYPES_OUT}, and .md beside)",
    )
    ap.add_argument(
        "--types",
        help="real files of these GGUF types (comma list, or all) against transformers, the eager path and llama.cpp",
    )
    ap.add_argument("--ctx", type=int, default=256, help="--types: llama-perplexity chunk size")
    ap.add_argument("--chunks", type=int, default=4, help="--types: llama-perplexity chunks")
    ap.add_argument("--no-hf", action="store_true", help="--types: leave transformers out (it is slow to load)")
    a = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if not a.text.is_file():
        print(f"error: text file {a.text} not found; pass --text FILE", file=sys.stderr)
        return 2
    if a.types:
        return types_main(a)
    path = default_model_path()
    ref_lm = load(str(path), fastpath="off", threads=a.threads)
    ids = ref_lm.tokenizer.encode(a.text.read_text(), add_special_tokens=False)[: a.tokens]
    ref = {m: ours_logits(ref_lm.model, ids, m) for m in ("prefill", "decode")}
    rows = [
        {
            "candidate": "reference (plain torch float32)",
            "mode": "decode",
            **compare(ref["prefill"], ref["decode"], ids),
        }
    ]
    for name, modes, run in candidates(path, ids, a.threads):
        for mode in modes:
            t0 = time.perf_counter()
            rows.append(
                {
                    "candidate": name,
                    "mode": mode,
                    **compare(ref[mode], run(mode), ids),
                    "seconds": round(time.perf_counter() - t0, 1),
                }
            )
            print(_line(rows[-1]), flush=True)
    print(f"\n{len(ids)} tokens of {a.text}; KL in nats, reference perplexity {rows[0]['ppl_ref']:.3f}")
    print(_line(rows[0]))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(
        json.dumps(
            {
                "model": str(path),
                "text": str(a.text),
                "tokens": len(ids),
                "threads": a.threads,
                "torch": torch.__version__,
                "machine": platform.processor() or platform.machine(),
                "rows": rows,
            },
            indent=1,
        )
    )
    return 0


def _line(r: dict) -> str:
    return (
        f"{r['candidate']:<42} {r['mode']:<8} KL mean {r['kl_mean']:.2e} p99 {r['kl_p99']:.2e} "
        f"max {r['kl_max']:.2e}  top-1 {r['top1_agree']:.3f}  max|Δlogit| {r['max_abs_dlogit']:.3f}  "
        f"ppl {r['ppl']:.3f}"
    )


if __name__ == "__main__":
    sys.exit(main())
