"""A synthetic model of a real release's shape (random weights) in Q4_K_M: OpScope vs llama-bench.

    .venv/bin/python benchmarks/synthetic_1b.py [--shape tinyllama-1.1b] [--rounds 3] [--pp-rounds 2] [--threads 2]

1. Writes the model as an F16 GGUF with the project's own writer (engine.testing.gguf_writer: the
   names, Q/K permutation and metadata llama.cpp's converter writes; a small byte-level BPE
   tokenizer), then llama-quantize turns it into Q4_K_M, so the tensor types are those of a real
   download of that shape. ``--shape`` (SHAPES): tinyllama-1.1b (the default: dim 2048, 22 layers,
   ffn 5632, 32 heads, 4 KV heads, vocab 32000; 1.1 B parameters, 0.67 GB in Q4_K_M, every row a
   multiple of 256 so the K types apply); qwen2.5-0.5b (dim 896, 24 layers, ffn 4864, 14 heads, 2
   KV heads, vocab 151936 tied: rows of 896 are no multiple of 256, so llama-quantize writes Q5_0
   and Q8_0 where Q4_K_M asks Q4_K and Q6_K, and the tied 136 M-weight embedding is the output
   matrix, as in the Qwen2.5 downloads); llama3.2-1b (dim 2048, 16 layers, ffn 8192, 32 heads, 8
   KV heads, vocab 128256 tied). Files are cached in ~/.cache/opscope/synthetic_1b (outside the
   repo); delete them with ``--clean``.
2. Runs the comparison of benchmarks/gguf_types.py on the Q4_K_M file: interleaved rounds of
   llama-bench (tg128 every round, pp512 in the first ``--pp-rounds``) and OpScope in a fresh process
   each, peak RSS per process. Goals: tg128 ≥ 1.0× llama.cpp, peak RSS ≤ 1.3× llama.cpp's.
3. Writes benchmarks/results/synthetic_1b.{md,json}.

A benchmark only, never run in CI (minutes, 3 GB of disk, ~2 GB of RAM per process).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gguf_types as G

CACHE = G.CACHE.parent / "synthetic_1b"
# name -> (family, config): the published configs' shapes
SHAPES = {
    "tinyllama-1.1b": (
        "llama",
        dict(
            hidden_size=2048,
            num_hidden_layers=22,
            intermediate_size=5632,
            num_attention_heads=32,
            num_key_value_heads=4,
            vocab_size=32000,
            max_position_embeddings=2048,
            rms_norm_eps=1e-5,
            rope_theta=10000.0,
            tie_word_embeddings=False,
        ),
    ),
    "qwen2.5-0.5b": (
        "qwen2",
        dict(
            hidden_size=896,
            num_hidden_layers=24,
            intermediate_size=4864,
            num_attention_heads=14,
            num_key_value_heads=2,
            vocab_size=151936,
            max_position_embeddings=32768,
            rms_norm_eps=1e-6,
            rope_theta=1000000.0,
            tie_word_embeddings=True,
        ),
    ),
    "llama3.2-1b": (
        "llama",
        dict(
            hidden_size=2048,
            num_hidden_layers=16,
            intermediate_size=8192,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=64,
            vocab_size=128256,
            max_position_embeddings=131072,
            rms_norm_eps=1e-5,
            rope_theta=500000.0,
            tie_word_embeddings=True,
        ),
    ),
}
GOAL_RSS_VS_LLAMA = 1.3

log = logging.getLogger("synthetic_1b")


def n_params(cfg: dict) -> int:
    from opscope.engine.testing.gguf_writer import tensor_shapes

    total = 0
    for shape in tensor_shapes(cfg).values():
        n = 1
        for d in shape:
            n *= d
        total += n
    return total


def file_stem(shape: str, layers: int) -> str:
    """The cached files' name, no dot in it (gguf_types.quantize names its output by the part before
    the first); the TinyLlama shape keeps the name it had before there were others."""
    return (
        f"llama-synthetic-{layers}L" if shape == "tinyllama-1.1b" else f"{shape.replace('.', '_')}-synthetic-{layers}L"
    )


def make_files(shape: str, layers: int | None, threads: int, cache: Path) -> tuple[Path, Path, dict]:
    """(F16 file, Q4_K_M file, config); both cached by shape and layer count."""
    from opscope.engine.testing.gguf_writer import hf_config, write_gguf

    family, base = SHAPES[shape]
    layers = layers or base["num_hidden_layers"]
    cfg = hf_config(family, **(base | {"num_hidden_layers": layers}))
    cache.mkdir(parents=True, exist_ok=True)
    stem = file_stem(shape, layers)
    f16 = cache / f"{stem}.F16.gguf"
    if not f16.is_file():
        _check_disk(cache, 2 * n_params(cfg) * 1.4)
        log.info("writing %s (%.2f B parameters, F16)", f16, n_params(cfg) / 1e9)
        tmp = f16.with_suffix(".tmp")
        write_gguf(tmp, cfg, types="F16", seed=0, name=stem)
        tmp.rename(f16)
    q = G.quantize(f16, "Q4_K_M", cache, threads)
    return f16, q, cfg


def _check_disk(where: Path, need_bytes: float) -> None:
    free = shutil.disk_usage(where).free
    if free < need_bytes:
        raise SystemExit(
            f"{where}: {free / 2**30:.1f} GiB free, the synthetic model needs "
            f"{need_bytes / 2**30:.1f} GiB; free some space or pass --cache elsewhere"
        )


def measure(
    path: Path, rounds: int, pp_rounds: int, pp: int, tg: int, threads: int, fastpath: str = "auto", shape: str = ""
) -> dict:
    """gguf_types' interleaved rounds; pp only in the first ``pp_rounds`` (pp512 of 1B is slow)."""
    rec = {
        "type": f"Q4_K_M (synthetic {shape})",
        "file": str(path),
        "file_bytes": path.stat().st_size,
        "tensor_types": G.tensor_types(path),
        "rounds": [],
    }
    for r in range(rounds):
        n_pp = pp if r < pp_rounds else 0
        order = ("llama", "opscope") if r % 2 == 0 else ("opscope", "llama")
        one = {}
        for who in order:
            one[who] = (
                G.run_llama(path, n_pp, tg, threads)
                if who == "llama"
                else G.run_opscope(path, n_pp, tg, threads, fastpath)
            )
        rec["rounds"].append(one)
        log.info("round %d: %s", r + 1, G._round_line(one, pp, tg))
        if "refused" in one["opscope"]:
            break
    return rec


def markdown(rec: dict, meta: dict) -> str:
    s = rec["summary"]
    ratio = None
    if s["rss_opscope"] and s["rss_llama"]:
        ratio = s["rss_opscope"].median / s["rss_llama"].median
    head = (
        f"# Synthetic {meta['shape_name']} (Q4_K_M): OpScope vs llama-bench\n\n"
        f"Model: {meta['params_b']:.2f} B parameters, {meta['shape']}; random weights written by "
        f"engine.testing.gguf_writer (F16), re-quantized by llama-quantize. {meta['threads']} threads, "
        f"{meta['rounds']} rounds (pp{meta['pp']} in the first {meta['pp_rounds']})"
        f"{'' if meta.get('fastpath', 'auto') == 'auto' else ', OpScope fast path ' + meta['fastpath']}. Load average "
        f"before {meta['load_before']}, after {meta['load_after']}. Goals: tg{meta['tg']} ≥ 1.0×, "
        f"peak RSS ≤ {GOAL_RSS_VS_LLAMA}× llama.cpp's"
        + (f" (measured {ratio:.2f}×: {'✓' if ratio <= GOAL_RSS_VS_LLAMA else '✗'})" if ratio else "")
        + ".\n\n"
    )
    return head + G.markdown([rec], meta).split("\n\n", 2)[2]


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pp-rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="tinyllama-1.1b")
    ap.add_argument("--layers", type=int, default=None, help="fewer layers than the shape's (a quicker file)")
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--cache", default=str(CACHE))
    ap.add_argument(
        "--out", default=None, help="result path without suffix (default: results/synthetic_1b, or _<shape>)"
    )
    ap.add_argument("--clean", action="store_true", help="delete the cached model files and exit")
    ap.add_argument(
        "--fastpath",
        default="auto",
        help="OpScope's fast-path settings, e.g. activations=q8 (engine.fastpath.FastPathOptions)",
    )
    ap.add_argument(
        "--variant",
        default=None,
        help="OpScope's CPU kernel variant (OPSCOPE_CPU_VARIANT), e.g. avx2 on an AVX-512 host",
    )
    args = ap.parse_args(argv)
    if args.out is None:
        tail = "" if args.shape == "tinyllama-1.1b" else "_" + args.shape.replace(".", "_")
        args.out = str(G.RESULTS / f"synthetic_1b{tail}")
    if args.variant:
        os.environ["OPSCOPE_CPU_VARIANT"] = args.variant  # the children inherit it
        G.stand_in(args.variant)  # torch's libraries and the peer limited to it too (gguf_types.STAND_IN)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    cache = Path(args.cache)
    if args.clean:
        shutil.rmtree(cache, ignore_errors=True)
        return 0
    f16, q, cfg = make_files(args.shape, args.layers, args.threads, cache)
    G.build_kernels()
    meta = {
        "threads": args.threads,
        "rounds": args.rounds,
        "pp_rounds": args.pp_rounds,
        "pp": args.pp,
        "tg": args.tg,
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "load_before": G.loadavg(),
        "params_b": n_params(cfg) / 1e9,
        "source": str(f16),
        "shape_name": args.shape,
        "shape": {k: cfg[k] for k in SHAPES[args.shape][1]},
        "fastpath": args.fastpath,
    } | G.host_meta()
    rec = measure(q, args.rounds, args.pp_rounds, args.pp, args.tg, args.threads, args.fastpath, args.shape)
    rec["summary"] = G.summarize(rec, args.pp, args.tg)
    meta["load_after"] = G.loadavg()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "model": rec}, indent=1, default=G._json_default))
    out.with_suffix(".md").write_text(markdown(rec, meta))
    print(out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
