"""pp512 (or tg128) of this checkout against another (an older commit), each side a fresh process, interleaved.

    git worktree add /tmp/old REV
    .venv/bin/python benchmarks/pp_ab.py /tmp/old --types Q4_0,Q6_K --rounds 5 [--spec activations=q8] [--tg]

Per round and type the two sides run in alternating order; each loads the SmolLM2-135M file of that
type (benchmarks/gguf_types.py's cache) on the fast path and times one 512-token forward pass, best
of 3 after a warm-up, 2 threads; with ``--tg``, 128 single-token decode steps through the model
(its decode step: the fused C++ one where it applies) after a 16-token prefill (``--depth``), best of 3. The other checkout is imported through a folder holding an
``opscope`` link to it (its kernels build into the shared kernel cache under their own hash).
Prints one JSON line per run (with the 1-minute load) and the medians and per-round ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CACHE = Path.home() / ".cache/opscope/gguf_types"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from gguf_types import host_meta, loadavg  # noqa: E402


def child(path: str, spec: str, tg: bool = False, depth: int = 16) -> None:
    import opscope
    import torch
    from opscope.engine.api import load

    torch.set_num_threads(2)
    model = load(path, fastpath=spec, threads=2).model
    if tg:
        print(json.dumps({"package": os.path.dirname(opscope.__file__), "tok_s": _tg128(model, depth)}))
        return
    toks = torch.randint(100, 20000, (1, 512))
    best = float("inf")
    with torch.inference_mode():
        for i in range(4):
            t0 = time.perf_counter()
            model(toks, 0, last_only=True)
            if i:
                best = min(best, time.perf_counter() - t0)
    print(json.dumps({"package": os.path.dirname(opscope.__file__), "tok_s": 512 / best}))


def _tg128(model, depth: int = 16) -> float:
    import torch

    model.setup_cache(1, depth + 144)
    best = float("inf")
    with torch.inference_mode():
        for i in range(4):  # the first a warm-up
            model(torch.randint(100, 20000, (1, depth)), 0, last_only=True)
            t0 = time.perf_counter()
            for pos in range(depth, depth + 128):
                model(torch.tensor([[1000 + pos]]), pos)
            if i:
                best = min(best, time.perf_counter() - t0)
    return 128 / best


def side(path: Path, spec: str, pythonpath: str | None, tg: bool = False, depth: int = 16) -> float:
    env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")
    env.pop("PYTHONPATH", None)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    cmd = [sys.executable, __file__, "--child", str(path), "--spec", spec, "--depth", str(depth)] + (
        ["--tg"] if tg else []
    )
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True, timeout=600)
    return json.loads(out.stdout.splitlines()[-1])["tok_s"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("old", nargs="?", type=Path, help="the other checkout")
    ap.add_argument("--types", default="Q4_0,Q6_K,IQ4_NL,Q4_K_M", help="types of the SmolLM2 files, or GGUF paths")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--spec", default="activations=q8")
    ap.add_argument("--tg", action="store_true", help="tg128 (decode) instead of pp512")
    ap.add_argument("--depth", type=int, default=16, help="with --tg: the tokens prefilled before the 128 decoded")
    ap.add_argument("--out", type=Path, help="also write the table, the CPU's flags and the load to OUT.md")
    ap.add_argument("--child")
    args = ap.parse_args(argv)
    if args.child:
        child(args.child, args.spec, args.tg, args.depth)
        return 0
    runs: dict[str, dict[str, list[float]]] = {t: {"old": [], "new": []} for t in args.types.split(",")}
    load_before = loadavg()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "opscope").symlink_to(args.old.resolve())
        for r in range(args.rounds):
            for t, res in runs.items():
                path = Path(t) if t.endswith(".gguf") else CACHE / f"SmolLM2-135M-Instruct.{t}.gguf"
                for name in ("old", "new") if r % 2 == 0 else ("new", "old"):
                    res[name].append(side(path, args.spec, tmp if name == "old" else None, args.tg, args.depth))
                    load = loadavg().split()[0]
                    print(json.dumps({"round": r, "type": t, "side": name, "tok_s": res[name][-1], "load": load}))
    lines = []
    for t, res in runs.items():
        ratio = [n / o for n, o in zip(res["new"], res["old"], strict=True)]
        lines.append(
            f"{t}: old {statistics.median(res['old']):.0f}, new {statistics.median(res['new']):.0f} tok/s; "
            f"new/old median {statistics.median(ratio):.2f} [{min(ratio):.2f}–{max(ratio):.2f}]"
        )
        print(lines[-1])
    if args.out:
        meta = host_meta()
        what = f"tg128 after {args.depth} tokens" if args.tg else "pp512"
        args.out.with_suffix(".md").write_text(
            f"# {what}, this checkout (new) against {args.old} (old), fast path {args.spec}\n\n"
            f"{args.rounds} rounds, sides alternating, 2 threads; load average before {load_before}, "
            f"after {loadavg()}. CPU: {meta['cpu']}; {meta.get('stand_in', 'no ISA cap')}.\n\n"
            + "".join(f"- {line}\n" for line in lines)
            + f"\nlscpu flags: `{meta['cpu_flags']}`\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
