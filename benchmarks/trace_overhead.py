"""What tracing costs: decode tok/s traced vs untraced on the default model, and µs per traced op.

Two measurements, every variant interleaved within each round (so load from other jobs hits all
variants alike), medians and min..max over rounds, ratios to the untraced baseline:

1. Decode: the default model (CPU, float32) generates ``--tokens`` tokens (EOS ignored) through the
   engine's own loop; decode tok/s from the engine's Finished stats. Overhead per traced op =
   (traced decode step time - untraced) / ops per decode step.
2. Per op: ``--ops`` tiny additions (1×16 float32) in a loop, so the op itself costs ~1 µs and the
   trace's cost dominates. An empty TorchDispatchMode is the floor any dispatch-mode trace pays.

3. Scripts (``--scripts``): examples/slow_train.py and fast_train.py run in this process as
   `opscope trace -- python SCRIPT` runs them (engine.trace.script), untraced vs traced with the
   training-health checks, wall and CPU seconds per run; the load average is printed with them.

Variants: source lines off / only for off-target ops ("findings", the default) / for every op;
module hooks per model vs global; the garbage-collector pause off.

    .venv/bin/python benchmarks/trace_overhead.py [--rounds 5] [--tokens 16] [--ops 5000] [--json out.json]
    .venv/bin/python benchmarks/trace_overhead.py --scripts-only --rounds 5 --steps 30
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install

from opscope.engine.trace.capture import Tracer
from opscope.engine.trace.events import TraceOptions

VARIANTS = {  # name → TraceOptions (None: untraced)
    "untraced": None,
    "source=off": TraceOptions(source="off"),
    "source=findings": TraceOptions(source="findings"),
    "source=all": TraceOptions(source="all"),
    "hooks=global": TraceOptions(hooks="global"),
    "gc not paused": TraceOptions(pause_gc=False),
}


class _Empty(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _decode_once(lm, options: TraceOptions | None, tokens: int) -> tuple[float, float, int]:
    """(decode tok/s, process CPU seconds of the whole generation, ops traced) of one generation."""
    from opscope.engine.generation.generate import GenerationConfig
    from opscope.engine.trace.session import trace_generation

    config = GenerationConfig(max_tokens=tokens, ignore_eos=True)
    c0 = time.process_time()
    if options is None:
        *_, finished = lm.generate("The capital of France is", config)
        return finished.stats.decode_tok_s, time.process_time() - c0, 0
    run = trace_generation(lm, "The capital of France is", config, options)
    return run.finished.stats.decode_tok_s, time.process_time() - c0, run.result.stats.ops


def bench_decode(rounds: int, tokens: int) -> dict:
    from opscope.engine.api import load

    lm = load(fastpath="off")  # the torch model, which is what a trace runs on (see engine.trace.session.torch_twin)
    _decode_once(lm, None, 4)  # warm-up: caches, lazy inits
    tok_s = {name: [] for name in VARIANTS}
    cpu_s = {name: [] for name in VARIANTS}
    ops = []
    for r in range(rounds):
        order = list(VARIANTS)[r % len(VARIANTS) :] + list(VARIANTS)[: r % len(VARIANTS)]
        for name in order:
            rate, cpu, n_ops = _decode_once(lm, VARIANTS[name], tokens)
            tok_s[name].append(rate)
            cpu_s[name].append(cpu)
            ops += [n_ops] if n_ops else []
    return {"tok_s": tok_s, "cpu_s": cpu_s, "ops_per_generation": statistics.median(ops), "tokens": tokens}


def _op_loop(n: int) -> None:
    x = torch.randn(1, 16)
    for _ in range(n):
        torch.add(x, x)


def _time_ops(mode, n: int) -> tuple[float, float]:
    """(wall, CPU) seconds per op of the loop under ``mode`` (None: no mode). CPU time (this
    process) is the steadier one on a shared machine: it does not count time other jobs ran."""
    with mode if mode is not None else contextlib.nullcontext():
        w0, c0 = time.perf_counter(), time.process_time()
        _op_loop(n)
        return (time.perf_counter() - w0) / n, (time.process_time() - c0) / n


def bench_ops(rounds: int, n: int) -> dict:
    makers = {"no mode": lambda: None, "empty dispatch mode": _Empty}
    makers |= {name: (lambda o=opts: Tracer(o)) for name, opts in VARIANTS.items() if opts is not None}
    _time_ops(Tracer(TraceOptions()), 200)  # warm-up
    wall = {name: [] for name in makers}
    cpu = {name: [] for name in makers}
    for _ in range(rounds):
        for name, make in makers.items():
            w, c = _time_ops(make(), n)
            wall[name].append(w * 1e6)
            cpu[name].append(c * 1e6)
    return {"wall_us": wall, "cpu_us": cpu}


def bench_hooks(rounds: int, calls: int = 200) -> dict:
    """CPU µs per module call (forward of a 64-deep stack of tiny Linear layers, 2 ops each):
    per-model hooks vs torch's global hooks vs a trace without module paths."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(64)])
    x = torch.randn(1, 4)
    makers = {
        "empty dispatch mode": _Empty,
        "trace, no module paths": lambda: Tracer(TraceOptions()),
        "hooks=model": lambda: Tracer(TraceOptions(hooks="model"), model=model),
        "hooks=global": lambda: Tracer(TraceOptions(hooks="global"), model=model),
    }
    samples = {name: [] for name in makers}
    for _ in range(rounds):
        for name, make in makers.items():
            with torch.no_grad(), make():
                c0 = time.process_time()
                for _ in range(calls // 64 + 1):
                    model(x)
                samples[name].append((time.process_time() - c0) * 1e6 / ((calls // 64 + 1) * 65))
    return samples


EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _run_script_once(path: Path, steps: int, traced: bool) -> tuple[float, float]:
    """(wall, CPU) seconds of one run of an example script, its output discarded."""
    import io

    from opscope.engine.trace.events import TraceOptions
    from opscope.engine.trace.script import ScriptSpec, run_script, trace_script

    spec = ScriptSpec(path=str(path), args=("--steps", str(steps), "--device", "cpu"))
    with contextlib.redirect_stdout(io.StringIO()):
        w0, c0 = time.perf_counter(), time.process_time()
        outcome = trace_script(spec, TraceOptions(target="cpu")).outcome if traced else run_script(spec)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    assert outcome.exit_code == 0, outcome.error
    return wall, cpu


def bench_scripts(rounds: int, steps: int) -> dict:
    import os

    out = {"steps": steps, "load_average": list(os.getloadavg())}
    for name in ("slow_train.py", "fast_train.py"):
        path = EXAMPLES / name
        _run_script_once(path, 2, True)  # warm-up: imports, lazy inits
        samples = {"untraced": {"wall_s": [], "cpu_s": []}, "traced": {"wall_s": [], "cpu_s": []}}
        for r in range(rounds):
            for variant in ("untraced", "traced") if r % 2 == 0 else ("traced", "untraced"):
                wall, cpu = _run_script_once(path, steps, variant == "traced")
                samples[variant]["wall_s"].append(wall)
                samples[variant]["cpu_s"].append(cpu)
        out[name] = samples
    out["load_average_after"] = list(os.getloadavg())
    return out


def print_scripts(res: dict) -> None:
    print(
        f"\nExample scripts, {res['steps']} steps, in-process (load average before "
        f"{', '.join(f'{v:.1f}' for v in res['load_average'])}; after "
        f"{', '.join(f'{v:.1f}' for v in res['load_average_after'])})"
    )
    print("  script           variant    wall s median (min..max)        CPU s median (min..max)     traced/untraced")
    for name in ("slow_train.py", "fast_train.py"):
        base_w = statistics.median(res[name]["untraced"]["wall_s"])
        base_c = statistics.median(res[name]["untraced"]["cpu_s"])
        for variant, v in res[name].items():
            ratio = (
                f"wall {statistics.median(v['wall_s']) / base_w:.2f}×, "
                f"CPU {statistics.median(v['cpu_s']) / base_c:.2f}×"
            )
            print(f"  {name:<16} {variant:<10} {_summary(v['wall_s'])}   {_summary(v['cpu_s'])}   {ratio}")


def _summary(values: list[float]) -> str:
    return f"{statistics.median(values):8.2f}  ({min(values):.2f}..{max(values):.2f})"


def print_results(decode: dict | None, ops: dict) -> None:
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for clock in ("cpu_us", "wall_us"):
        samples = ops[clock]
        base = statistics.median(samples["no mode"])
        print(f"\nPer op (tiny add loop), {clock[:-3]} µs per op: median (min..max)   extra vs no mode")
        for name, values in samples.items():
            print(f"  {name:<22} {_summary(values)}   +{statistics.median(values) - base:.2f}")
    print("\nModule hooks, CPU µs per module call (op costs included): median (min..max)")
    for name, values in ops["hooks_cpu_us_per_module_call"].items():
        print(f"  {name:<22} {_summary(values)}")
    if decode is None:
        return
    tok, cpu, n_ops = decode["tok_s"], decode["cpu_s"], decode["ops_per_generation"]
    base_tok, base_cpu = statistics.median(tok["untraced"]), statistics.median(cpu["untraced"])
    print(f"\nDecode, default model (CPU, float32), {decode['tokens']} tokens, {n_ops:.0f} ops per generation")
    print("  variant                decode tok/s median (min..max)   ratio   CPU s/generation   extra CPU µs/op")
    for name in tok:
        med_tok, med_cpu = statistics.median(tok[name]), statistics.median(cpu[name])
        extra = (med_cpu - base_cpu) * 1e6 / n_ops
        print(f"  {name:<22} {_summary(tok[name])}   {med_tok / base_tok:5.2f}   {med_cpu:8.2f}   {extra:+8.1f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--ops", type=int, default=5000)
    p.add_argument("--skip-decode", action="store_true", help="only the per-op loop (no model)")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--steps", type=int, default=30, help="steps of each example script (--scripts)")
    p.add_argument("--scripts", action="store_true", help="also time the example scripts traced vs untraced")
    p.add_argument("--scripts-only", action="store_true", help="only the example scripts")
    args = p.parse_args(argv)
    if args.scripts_only:
        res = bench_scripts(args.rounds, args.steps)
        print_scripts(res)
        if args.json:
            args.json.write_text(json.dumps({"scripts": res}, indent=1))
        return 0
    ops = bench_ops(args.rounds, args.ops)
    ops["hooks_cpu_us_per_module_call"] = bench_hooks(args.rounds)
    decode = None if args.skip_decode else bench_decode(args.rounds, args.tokens)
    print_results(decode, ops)
    scripts = bench_scripts(args.rounds, args.steps) if args.scripts else None
    if scripts:
        print_scripts(scripts)
    if args.json:
        args.json.write_text(json.dumps({"ops_us": ops, "decode": decode, "scripts": scripts}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
