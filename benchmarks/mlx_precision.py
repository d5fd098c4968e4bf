"""How far the MLX backend's load-time conversion moves a model's numbers, against the torch backend
on the same file (the table of issue 30: GGUF types × families on MLX).

    .venv/bin/python benchmarks/mlx_precision.py FILE.gguf [FILE.gguf ...] [--tokens 256] [--out F.json]
    .venv/bin/python benchmarks/mlx_precision.py --families [--out F.json]

Reference: the torch backend's plain model in float32 (``fastpath="off"``: the file's blocks
dequantized by gguf-py, tested against Hugging Face transformers in
tests/engine/models/test_families.py). Per file, teacher-forced on ``--text`` (prefill): mean and
99th-percentile KL(torch ‖ mlx) in nats, top-1 agreement and max |Δlogit| (benchmarks/precision.py's
``compare``), then 32 greedy tokens from a chat prompt on both backends (equal or the first
position where they part). The conversion line (``opscope models inspect --backend mlx``) is
printed with each row.

``--families``: the seven families as tiny random models (engine.testing.gguf_writer), every
GGUF type per family (types gguf-py cannot write are random valid blocks), against the torch
backend on the same file: whether MLX loads it, greedy tokens equal, mean KL.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from opscope.engine.formats.gguf_source import SUPPORTED_TYPES

DEFAULT_TEXT = Path("/usr/share/common-licenses/GPL-3")
GREEDY = 32
CHAT = [{"role": "user", "content": "Write a short poem about the sea."}]


def compare(ref: np.ndarray, got: np.ndarray) -> dict:
    lr = torch.log_softmax(torch.from_numpy(ref).double(), -1)
    lg = torch.log_softmax(torch.from_numpy(got).double(), -1)
    kl = (lr.exp() * (lr - lg)).sum(-1)
    return {
        "kl_mean": kl.mean().item(),
        "kl_p99": kl.quantile(0.99).item(),
        "top1_agree": (lr.argmax(-1) == lg.argmax(-1)).double().mean().item(),
        "max_abs_dlogit": float(np.abs(ref - got).max()),
    }


def greedy(lm, ids: list[int], n: int = GREEDY) -> list[int]:
    from opscope.engine.generation.events import Token
    from opscope.engine.generation.generate import GenerationConfig

    cfg = GenerationConfig(max_tokens=n, ignore_eos=True)
    return [e.token_id for e in lm.generate(ids, cfg) if isinstance(e, Token)]


def agreement(a: list[int], b: list[int]) -> str:
    if a == b:
        return f"equal ({len(a)})"
    first = (
        next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
        if any(x != y for x, y in zip(a, b))
        else min(len(a), len(b))
    )
    return f"part at {first}/{len(a)}"


def measure(path: Path, ids: list[int], prompt_ids: list[int]) -> dict:
    from opscope.engine.api import load
    from opscope.engine.backends import get_backend

    ref = load(str(path), fastpath="off")
    mlx = get_backend("mlx").load(path)
    row = {
        "file": path.name,
        "conversion": mlx.describe().get("conversion", "dense"),
        **compare(ref.logits(ids).numpy(), mlx.logits(ids)),
    }
    row["greedy"] = agreement(greedy(ref, prompt_ids), greedy(mlx, prompt_ids))
    return row


def files_table(paths: list[Path], text: Path, n_tokens: int) -> list[dict]:
    from opscope.engine import open_model

    rows = []
    for p in paths:
        tok = open_model(p).tokenizer
        ids = tok.encode(text.read_text())[:n_tokens]
        prompt = tok.encode(tok.apply_chat_template(CHAT, add_generation_prompt=True), add_special_tokens=False)
        rows.append(measure(p, ids, prompt))
        logging.info("%s", rows[-1])
    return rows


# -- --families: tiny random models, every type --------------------------------------------------
ALL_TYPES = SUPPORTED_TYPES  # every type the torch backend reads (engine.formats.gguf_source)


def families_table(root: Path, only: list[str] | None = None) -> list[dict]:
    from mlx_tiny import write_family
    from opscope.engine.testing.gguf_writer import FAMILIES

    rows = []
    for family in only or FAMILIES:
        for qtype in ALL_TYPES:
            path = write_family(root / f"{family}-{qtype}.gguf", family, qtype)
            row = {"family": family, "type": qtype}
            try:
                ids = [int(i) for i in np.random.default_rng(7).integers(1, 300, 48)]
                row.update(measure(path, ids, ids[:8]))
                row["loads"] = True
            except Exception as e:
                row.update(loads=False, error=f"{type(e).__name__}: {e}")
            rows.append(row)
            logging.info("%s", row)
    return rows


def markdown(rows: list[dict]) -> str:
    if rows and "family" in rows[0]:
        head = "| family | type | loads | greedy (32) | mean KL | top-1 | max Δlogit | conversion |\n|---|---|---|---|---|---|---|---|"
        body = [
            f"| {r['family']} | {r['type']} | {'yes' if r['loads'] else 'NO: ' + r['error']} | "
            f"{r.get('greedy', '')} | {r.get('kl_mean', float('nan')):.2e} | "
            f"{r.get('top1_agree', float('nan')):.3f} | {r.get('max_abs_dlogit', float('nan')):.3g} | "
            f"{r.get('conversion', '')} |"
            for r in rows
        ]
    else:
        head = (
            "| file | conversion | mean KL | p99 KL | top-1 | max Δlogit | greedy (32) |\n|---|---|---|---|---|---|---|"
        )
        body = [
            f"| {r['file']} | {r['conversion']} | {r['kl_mean']:.2e} | {r['kl_p99']:.2e} | "
            f"{r['top1_agree']:.3f} | {r['max_abs_dlogit']:.3g} | {r['greedy']} |"
            for r in rows
        ]
    return "\n".join([head, *body])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--families", action="store_true")
    ap.add_argument("--family", action="append", default=None, help="with --families: only these (repeatable)")
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--text", type=Path, default=DEFAULT_TEXT)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(1)
    if args.families:
        with tempfile.TemporaryDirectory() as d:
            rows = families_table(Path(d), args.family)
    else:
        rows = files_table(args.files, args.text, args.tokens)
    table = markdown(rows)
    print(table)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
        args.out.with_suffix(".md").write_text(table + "\n")


if __name__ == "__main__":
    main()
