"""CPU and memory cost of the telemetry sampler.

CPU: the sampler runs at 10 Hz and 50 Hz with every source available on this machine, for
``--seconds`` per trial, variants interleaved with an idle baseline (no sampler) over ``--rounds``
rounds so that load from other processes hits all variants alike. Reported as % of one core:
process CPU time (all threads, time.process_time) over wall time, the same minus the idle
baseline, and the sampler thread's own CPU time (time.thread_time read on that thread). Medians
and min..max over rounds.

Memory: bytes of the history ring for one hour at 10 Hz, for the series this machine has and for
an 8-GPU NVIDIA machine (same sizing rule: 8 bytes per tick for the timestamp + 8 per series).

    .venv/bin/python benchmarks/telemetry_overhead.py [--rounds 5] [--seconds 4] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install

from opscope.engine.telemetry import Sampler, default_sources
from opscope.engine.telemetry.nvml import GPU_FIELDS


def trial(interval_ms: float | None, seconds: float) -> dict[str, float]:
    """One timed window; ``interval_ms=None`` is the idle baseline."""
    sampler, thread_cpu = None, []
    if interval_ms is not None:
        sampler = Sampler(default_sources(), interval_ms=interval_ms, history_s=3600)
        sampler.subscribe(lambda snap: thread_cpu.append(time.thread_time()))  # runs on its thread
        sampler.start()
    wall0, cpu0 = time.perf_counter(), time.process_time()
    threading.Event().wait(seconds)  # the main thread idles; only the sampler works
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    out = {"process_pct": 100.0 * cpu / wall}
    if sampler is not None:
        sampler.stop()
        ticks = len(thread_cpu)
        out["thread_pct"] = 100.0 * (thread_cpu[-1] - thread_cpu[0]) / wall if ticks > 1 else float("nan")
        out["ticks_per_s"] = ticks / wall
        out["missed"] = sampler.missed_ticks
    return out


def run(rounds: int, seconds: float) -> dict:
    variants = {"idle": None, "10 Hz": 100.0, "50 Hz": 20.0}
    results: dict[str, list[dict]] = {name: [] for name in variants}
    for r in range(rounds):
        order = list(variants) if r % 2 == 0 else list(reversed(variants))  # no fixed position bias
        for name in order:
            results[name].append(trial(variants[name], seconds))
    idle = statistics.median(t["process_pct"] for t in results["idle"])
    return {
        "rounds": rounds,
        "seconds": seconds,
        "idle_process_pct": idle,
        "variants": {name: _summary(trials, idle) for name, trials in results.items()},
        "memory": memory(),
    }


def _summary(trials: list[dict], idle: float) -> dict:
    out = {}
    for key in trials[0]:
        values = [t[key] for t in trials]
        out[key] = {"median": statistics.median(values), "min": min(values), "max": max(values), "raw": values}
    out["process_minus_idle_pct"] = out["process_pct"]["median"] - idle
    return out


def memory() -> dict:
    sampler = Sampler(default_sources(), interval_ms=100, history_s=3600)
    sampler.sample_now()  # opens the sources: the ring is sized for the series found
    here = {"series": len(sampler.series_names()), "ticks": sampler.history.capacity, "bytes": sampler.history.nbytes}
    sampler.stop()
    n_8gpu = 8 * len(GPU_FIELDS) + 2 + 64 + 4  # 8 GPUs, host (64 cores), RAM, process
    return {"this_machine": here, "nvidia_8gpu_64core": {"series": n_8gpu, "bytes": 36_000 * 8 * (1 + n_8gpu)}}


def report(res: dict) -> str:
    lines = [
        f"telemetry sampler overhead: {res['rounds']} rounds x {res['seconds']} s per variant, "
        f"interleaved; % of one core, median [min..max]"
    ]
    for name, v in res["variants"].items():
        p = v["process_pct"]
        line = f"  {name:6} process {p['median']:6.3f}% [{p['min']:.3f}..{p['max']:.3f}]"
        if "thread_pct" in v:
            t = v["thread_pct"]
            line += (
                f"  minus idle {v['process_minus_idle_pct']:6.3f}%"
                f"  sampler thread {t['median']:6.3f}% [{t['min']:.3f}..{t['max']:.3f}]"
                f"  ticks/s {v['ticks_per_s']['median']:.1f}  missed {int(v['missed']['max'])} max"
            )
        lines.append(line)
    m = res["memory"]
    here, big = m["this_machine"], m["nvidia_8gpu_64core"]
    lines.append(
        f"  memory, 1 h at 10 Hz: {here['bytes'] / 2**20:.2f} MiB for {here['series']} series "
        f"here; {big['bytes'] / 2**20:.1f} MiB for {big['series']} series (8 GPUs, 64 cores)"
    )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--json", type=Path, default=None, help="also write raw results here")
    p.add_argument("--with-mlx", action="store_true", help="import mlx so its allocator source is active")
    args = p.parse_args()
    if args.with_mlx:
        import mlx.core  # noqa: F401
    res = run(args.rounds, args.seconds)
    print(report(res))
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
