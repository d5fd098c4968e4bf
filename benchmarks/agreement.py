"""Independent agreement: OpScope's figures against independent measurers on the same work.

    .venv/bin/python benchmarks/agreement.py [--sizes 256,512,1024] [--rounds 5] [--threads 1]
        [--pp 512 --tg 128 --reps 5 --llama-rounds 5] [--llama-bench PATH] [--model FILE] [--json OUT]

Prints one table: OpScope's matmul GFLOP/s next to torch.utils.benchmark.Timer.blocked_autorange's
(same process, interleaved rounds, medians), and the peers suite's llama.cpp pp/tg tok/s next to
llama-bench's own samples (and its avg_ts) on the same file in the same run, alternated round by
round and compared as medians over rounds (engine/bench/agreement.py says how, and what had made
them differ), with the load average, since agreement within 5 % is only expected on a quiet
machine; each llama.cpp round takes ~2.5 min at pp512/tg128 on 1 thread. The p-value
agreement with scipy.stats.mannwhitneyu is a test (tests/engine/bench/test_stats.py), not a timing.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opscope.engine.bench import agreement

DEFAULT_LLAMA_BENCH = Path(__file__).resolve().parents[2] / "shared/tools/llama.cpp/llama-bench"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="256,512,1024")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument(
        "--llama-rounds",
        type=int,
        default=5,
        help="interleaved rounds (suite, reference); each side: the median over rounds",
    )
    ap.add_argument("--llama-bench", default=str(DEFAULT_LLAMA_BENCH))
    ap.add_argument("--model", default=None)
    ap.add_argument("--skip-llama", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import torch
    from opscope.engine.core.defaults import default_model_path

    torch.set_num_threads(args.threads)
    rows = [agreement.matmul(int(n), args.dtype, args.rounds) for n in args.sizes.split(",")]
    if not args.skip_llama:
        model = Path(args.model) if args.model else default_model_path()
        rows += agreement.llama_bench(
            model, Path(args.llama_bench), args.pp, args.tg, args.reps, args.threads, args.llama_rounds
        )
    print(agreement.table(rows))
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "load_average": agreement.load_average(),
                    "threads": args.threads,
                    "rows": [asdict(r) | {"diff_pct": r.diff_pct, "agrees": r.agrees} for r in rows],
                },
                indent=1,
            )
        )
    return 0 if all(r.agrees for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
