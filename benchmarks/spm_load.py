"""Loading a Gemma-sized SentencePiece vocabulary (256k pieces): the BPE merges rebuilt per load.

    .venv/bin/python benchmarks/spm_load.py [--pieces 256000] [--rounds 3]

The vocabulary is synthetic (no hub here): pieces made as a BPE trainer makes them (each one two
earlier pieces, Latin, Greek, Cyrillic and CJK characters, the 256 byte tokens, Gemma's specials),
in a GGUF-style metadata dict with Gemma's architecture (merges ranked by position). Per round,
interleaved, each in a fresh child process so nothing is shared:

- before: the loop the engine ran until now, transformers' ``generate_merges`` (the same list, in
  the same order; checked equal once), then the same ``tokenizers`` BPE;
- cold: ``engine.tokenizer.from_gguf`` with an empty merge cache (vectorised construction + write);
- warm: ``from_gguf`` again, reading the merge cache.

Prints the median and [min–max] wall and CPU seconds of each, and ``uptime`` before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def gemma_meta(n: int, seed: int = 0) -> dict:
    rnd = random.Random(seed)
    special = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    alphabet = list(
        dict.fromkeys(
            list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,;:!?'\"()[]{}-_+=*/\\<>@#$%&")
            + ["\u2581"]
            + [chr(c) for c in range(0x3B1, 0x3C9)]
            + [chr(c) for c in range(0x430, 0x44F)]
            + [chr(c) for c in range(0x4E00, 0x4E00 + 2000)]
        )
    )
    pieces, seen = list(alphabet), set(alphabet)
    target = n - len(special) - len(byte_tokens)
    while len(pieces) < target:
        m = len(pieces)
        a = pieces[int(m * rnd.random() ** 0.5)] if rnd.random() < 0.5 else pieces[rnd.randrange(min(m, 4000))]
        b = pieces[int(m * rnd.random() ** 3)]
        if len(a) + len(b) <= 16 and a + b not in seen:
            seen.add(a + b)
            pieces.append(a + b)
    tokens = special + byte_tokens + pieces
    return {
        "general.architecture": "gemma3",
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": [0.0] * len(tokens),
        "tokenizer.ggml.token_type": [3] * 4 + [4, 4] + [6] * 256 + [1] * len(pieces),
        "tokenizer.ggml.bos_token_id": 2,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.unknown_token_id": 3,
        "tokenizer.ggml.padding_token_id": 0,
    }


def child(mode: str, meta_file: str) -> None:
    meta = json.loads(Path(meta_file).read_text(encoding="utf-8"))
    wall, cpu = time.perf_counter(), time.process_time()
    if mode == "before":
        from tokenizers import Tokenizer, models
        from transformers.convert_slow_tokenizer import generate_merges

        tokens = meta["tokenizer.ggml.tokens"]
        vocab = {t: i for i, t in enumerate(tokens)}
        merges = generate_merges(vocab, [(t, -float(i)) for i, t in enumerate(tokens)])
        Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=True, byte_fallback=True, unk_token="<unk>"))
    else:
        from opscope.engine.tokenizer.loader import from_gguf

        from_gguf(meta, Path(meta_file))
    print(json.dumps({"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}))


def run(mode: str, meta_file: Path, cache: Path) -> dict:
    env = {**os.environ, "OPSCOPE_CACHE_DIR": str(cache)}
    out = subprocess.run(
        [sys.executable, __file__, "--child", mode, str(meta_file)], env=env, check=True, capture_output=True, text=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pieces", type=int, default=256_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", nargs=2, metavar=("MODE", "META"))
    args = ap.parse_args()
    if args.child:
        return child(*args.child)
    print("uptime before:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    meta = gemma_meta(args.pieces)
    with tempfile.TemporaryDirectory() as tmp:
        meta_file = Path(tmp) / "meta.json"
        meta_file.write_text(json.dumps(meta), encoding="utf-8")
        _check_same_merges(meta)
        results: dict[str, list[dict]] = {"before": [], "cold": [], "warm": []}
        for r in range(args.rounds):
            cache = Path(tmp) / f"cache{r}"
            modes = ["before", "cold", "warm"] if r % 2 == 0 else ["cold", "warm", "before"]
            for mode in modes:
                results[mode].append(run(mode, meta_file, cache))
    print(f"{args.pieces} pieces, {args.rounds} rounds, seconds median [min–max]:")
    for mode, rows in results.items():
        for what in ("wall", "cpu"):
            v = [row[what] for row in rows]
            print(f"  {mode:6s} {what:4s} {statistics.median(v):6.2f} [{min(v):.2f}–{max(v):.2f}]")
    print("uptime after:", subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


def _check_same_merges(meta: dict) -> None:
    from opscope.engine.tokenizer.spm import merges_from_scores
    from transformers.convert_slow_tokenizer import generate_merges

    tokens = meta["tokenizer.ggml.tokens"]
    scores = [-float(i) for i in range(len(tokens))]
    assert merges_from_scores(tokens, scores) == generate_merges(
        {t: i for i, t in enumerate(tokens)}, list(zip(tokens, scores))
    )


if __name__ == "__main__":
    main()
