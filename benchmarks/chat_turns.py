"""TTFT per chat turn with and without KV-cache prefix reuse (engine.prefix_cache), interleaved.

    .venv/bin/python benchmarks/chat_turns.py --rounds 3 --tokens 48

A scripted conversation (fixed user messages, greedy, up to ``--tokens`` per reply) on the embedded
default model. Each round runs the whole conversation once with reuse on and once with it off, the
order alternating between rounds, so a neighbour's load hits both alike; every conversation starts
from a cache that holds nothing (as after a load). With reuse, TTFT of turn N should not grow with
the history: the ratio turn5/turn1 of median TTFTs is the figure (goal: within 1.5×).
TTFT comes from the engine's own events (request → first token), as everywhere else.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from opscope.engine.api import load
from opscope.engine.generation import prefix_cache
from opscope.engine.generation.events import Finished, Token
from opscope.engine.generation.generate import GenerationConfig

USER_TURNS = (
    "Hi! Can you help me plan a short trip to Paris?",
    "What are three museums I should visit there?",
    "Which one is best for modern art?",
    "How do I get there from the Eiffel Tower?",
    "What should I eat nearby for lunch?",
    "Thanks! Can you summarize the plan in two sentences?",
)
MODES = {"reuse": True, "no_reuse": False}
RESULTS = Path(__file__).parent / "results" / "chat_turns.json"


def conversation(lm, reuse: bool, tokens: int) -> list[dict]:
    """One scripted conversation from a cache that holds nothing; per turn: TTFT and token counts."""
    prefix_cache.forget(lm.model)
    messages, turns = [], []
    for text in USER_TURNS:
        messages.append({"role": "user", "content": text})
        ids, done = [], None
        for ev in lm.chat(messages, GenerationConfig(max_tokens=tokens, reuse_prefix=reuse)):
            if isinstance(ev, Token):
                ids.append(ev.token_id)
            elif isinstance(ev, Finished):
                done = ev
        s = done.stats
        turns.append(
            {
                "ttft_ms": s.ttft_ms,
                "prompt_tokens": s.prompt_tokens,
                "cached_tokens": s.cached_tokens,
                "generated_tokens": s.generated_tokens,
                "token_ids": ids,
            }
        )
        messages.append({"role": "assistant", "content": done.text})
    return turns


def summarize(samples: dict[str, list[list[dict]]]) -> dict:
    out = {}
    for mode, rounds in samples.items():
        per_turn = []
        for t in range(len(USER_TURNS)):
            ttft = [r[t]["ttft_ms"] for r in rounds]
            per_turn.append(
                {
                    "turn": t + 1,
                    "ttft_median_ms": statistics.median(ttft),
                    "ttft_min_ms": min(ttft),
                    "ttft_max_ms": max(ttft),
                    "prompt_tokens": rounds[0][t]["prompt_tokens"],
                    "cached_tokens": rounds[0][t]["cached_tokens"],
                    "generated_tokens": rounds[0][t]["generated_tokens"],
                }
            )
        ratio = per_turn[4]["ttft_median_ms"] / per_turn[0]["ttft_median_ms"]
        out[mode] = {"turns": per_turn, "turn5_over_turn1": ratio}
    return out


def same_tokens(samples: dict[str, list[list[dict]]]) -> bool:
    """Greedy replies must not depend on the reuse: every conversation gives the same token ids."""
    first = [t["token_ids"] for t in samples["no_reuse"][0]]
    return all([t["token_ids"] for t in conv] == first for rounds in samples.values() for conv in rounds)


def table(summary: dict) -> str:
    lines = [
        "| turn | prompt tok | cached (reuse) | TTFT reuse ms, median (min–max) | TTFT no reuse ms, median (min–max) |",
        "|---|---|---|---|---|",
    ]
    on, off = summary["reuse"]["turns"], summary["no_reuse"]["turns"]
    for a, b in zip(on, off):
        lines.append(
            f"| {a['turn']} | {a['prompt_tokens']} | {a['cached_tokens']} | "
            f"{a['ttft_median_ms']:.0f} ({a['ttft_min_ms']:.0f}–{a['ttft_max_ms']:.0f}) | "
            f"{b['ttft_median_ms']:.0f} ({b['ttft_min_ms']:.0f}–{b['ttft_max_ms']:.0f}) |"
        )
    lines.append(
        f"| turn5/turn1 | | | {summary['reuse']['turn5_over_turn1']:.2f}× | "
        f"{summary['no_reuse']['turn5_over_turn1']:.2f}× |"
    )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=48, help="max tokens per reply")
    ap.add_argument("--fastpath", default="auto", help="engine.api.load's fast-path setting")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=str(RESULTS), help="where to write the results")
    args = ap.parse_args()

    lm = load(fastpath=args.fastpath, threads=args.threads)
    for _ in lm.chat([{"role": "user", "content": "Hello"}], GenerationConfig(max_tokens=4)):
        pass  # warm-up: first-call costs are not a turn's
    load_before = os.getloadavg()
    samples: dict[str, list[list[dict]]] = {mode: [] for mode in MODES}
    t0 = time.perf_counter()
    for r in range(args.rounds):
        order = list(MODES) if r % 2 == 0 else list(reversed(MODES))
        for mode in order:
            samples[mode].append(conversation(lm, MODES[mode], args.tokens))
    summary = summarize(samples)
    result = {
        "model": str(lm.source.path),
        "fastpath": lm.options.fastpath,
        "threads": args.threads,
        "rounds": args.rounds,
        "max_tokens": args.tokens,
        "user_turns": list(USER_TURNS),
        "same_tokens": same_tokens(samples),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "wall_s": time.perf_counter() - t0,
        "summary": summary,
        "samples": samples,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=1))
    print(table(summary))
    print(
        f"same tokens with and without reuse: {result['same_tokens']}; load {load_before} → "
        f"{result['loadavg_after']}; wrote {args.json}"
    )


if __name__ == "__main__":
    main()
