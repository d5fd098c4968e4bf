"""Independent agreement: OpScope's figures next to an independent measurer's on the same work.

- matmul: OpScope's runner on the matmul suite's point against
  ``torch.utils.benchmark.Timer.blocked_autorange`` on the same shape and dtype, in the same process,
  interleaved round by round (A B, B A, ...) so load from other jobs hits both alike; each side's
  figure is the median over rounds of its per-round median.
- llama.cpp: the peers suite's ``llama_bench`` figures (OpScope runs llama-bench one repetition per
  child process and takes its samples) against ``llama-bench -r R``'s own samples on the same
  file, alternated round by round (suite, reference; reference, suite; ...); each side's figure is
  the median over rounds of its per-round median (``llama_bench`` says what had made them differ);
  llama-bench's avg_ts is shown beside it.

Each row is (what, OpScope's figure, the reference's, the difference in %). The agreement bar is
``TOLERANCE_PCT`` on a quiet machine; ``load_average`` is reported beside it so a reader can tell.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass
from pathlib import Path

TOLERANCE_PCT = 5.0


@dataclass(frozen=True)
class Agreement:
    what: str
    unit: str
    opscope: float
    reference: float
    reference_name: str
    other_cores: float | None = None  # cores other processes kept busy meanwhile (engine.cpuload)
    opscope_rounds: tuple[float, ...] = ()  # per-round figures, where the comparison ran in rounds
    reference_rounds: tuple[float, ...] = ()
    reference_mean: float | None = None  # llama-bench's avg_ts (the mean of the same samples), median over rounds

    @property
    def diff_pct(self) -> float:
        return (self.opscope / self.reference - 1.0) * 100.0

    @property
    def agrees(self) -> bool:
        return abs(self.diff_pct) <= TOLERANCE_PCT


def load_average() -> tuple[float, float, float]:
    return os.getloadavg()


def _opscope_matmul(n: int, dtype: str, min_time_s: float) -> float:
    from opscope.engine.bench.measure.runner import RunnerConfig, measure_point
    from opscope.engine.bench.suites.matmul import make_point

    cfg = RunnerConfig(warmup=2, min_reps=10, min_time_s=min_time_s)
    outcome = measure_point(make_point(n, dtype, "cpu"), cfg)
    if not outcome.ok:
        raise RuntimeError(f"matmul n={n} {dtype} failed: {outcome.error}")
    return statistics.median(outcome.metrics[0].samples)


def _torch_timer_matmul(n: int, dtype: str, min_time_s: float) -> float:
    import torch
    from torch.utils.benchmark import Timer

    g = torch.Generator(device="cpu").manual_seed(n)
    a = torch.randn(n, n, generator=g).to(dtype=getattr(torch, dtype))
    b = torch.randn(n, n, generator=g).to(dtype=getattr(torch, dtype))
    c = torch.empty_like(a)
    timer = Timer(
        "torch.matmul(a, b, out=c)",
        globals={"torch": torch, "a": a, "b": b, "c": c},
        num_threads=torch.get_num_threads(),
    )
    m = timer.blocked_autorange(min_run_time=min_time_s)
    return 2.0 * n**3 / m.median / 1e9


def matmul(n: int, dtype: str = "float32", rounds: int = 5, min_time_s: float = 0.3) -> Agreement:
    """OpScope's matmul GFLOP/s against torch.utils.benchmark's on the same n×n @ n×n.

    ``other_cores`` records the foreign load: agreement is a claim about a quiet machine, since
    under load the two timers part ways by design (docs/decisions/0007-matmul-agreement-on-a-quiet-machine.md)."""
    from opscope.engine.core.cpuload import OtherLoad

    load = OtherLoad()
    ours: list[float] = []
    theirs: list[float] = []
    for r in range(rounds):
        sides = [(ours, _opscope_matmul), (theirs, _torch_timer_matmul)]
        for out, fn in sides if r % 2 == 0 else sides[::-1]:
            out.append(fn(n, dtype, min_time_s))
    return Agreement(
        f"matmul {dtype} n={n}",
        "GFLOP/s",
        statistics.median(ours),
        statistics.median(theirs),
        "torch.utils.benchmark blocked_autorange",
        load.cores(),
    )


def llama_bench(
    model: Path, binary: Path, pp: int = 512, tg: int = 128, reps: int = 5, threads: int | None = None, rounds: int = 5
) -> list[Agreement]:
    """The peers suite's llama-bench pp/tg tok/s against llama-bench's own, in ``rounds`` interleaved
    rounds (suite then reference, reference then suite, ...); each side's figure is the median over
    rounds of its per-round figure.

    Per round, the reference is one ``llama-bench -p PP -n TG -t T -r REPS`` (what a user runs),
    its figure the median of the REPS samples it prints (``samples_ts``; its avg_ts, their mean, is
    kept beside it), and the suite is one peers run of REPS repetitions, its figure the median of
    its samples, each one llama-bench child ``-r 1``: the same binary, file, threads, batch,
    priority and polling, defaults all. What differed before, with the suite reading 9-12 % above:

    - the suite re-ran repetitions taken under foreign load and kept the clean ones, while the
      reference kept every sample: a selection towards fast samples on one side only. Here the
      suite keeps every sample too (``NO_RERUN``), as llama-bench does;
    - the sides were pooled unevenly: 15 reference samples from 3 processes (the first of them the
      run's first llama-bench, on a possibly cold page cache) and their mean, against ~10 suite
      samples from ~10 processes and their median. Speed can differ from process to process (memory
      placement), so 3 processes are a small sample, and a mean follows slow outliers a median
      ignores (one repetition slowed 2x by a burst of load moves avg_ts of 5 by 10 %). Now both
      sides take the median of llama-bench's samples per round and the median over the same
      rounds; one untimed llama-bench run warms the page cache before round 1.
    """
    import torch
    from opscope.engine.bench.peers import llama_bench as lb
    from opscope.engine.core.cpuload import OtherLoad

    threads = threads or torch.get_num_threads()
    lb.run(binary, model, min(pp, 16), min(tg, 4), threads, 1)  # page cache and CPU state, not timed
    load = OtherLoad()
    ours: dict[str, list[float]] = {"pp": [], "tg": []}
    theirs: dict[str, list[float]] = {"pp": [], "tg": []}
    means: dict[str, list[float]] = {"pp": [], "tg": []}

    def reference() -> None:
        run = lb.run(binary, model, pp, tg, threads, reps)
        for test, n, avg, samples in (("pp", pp, run.pp_avg_ts, run.pp_s), ("tg", tg, run.tg_avg_ts, run.tg_s)):
            theirs[test].append(statistics.median(n / s for s in samples))
            means[test].append(avg if avg is not None else statistics.fmean(n / s for s in samples))

    def suite() -> None:
        figures = _peers_round(model, binary, pp, tg, reps, threads)
        for test in ("pp", "tg"):
            ours[test].append(figures[test])

    for r in range(rounds):
        for side in (suite, reference) if r % 2 == 0 else (reference, suite):
            side()
    other = load.cores()
    return [
        Agreement(
            f"llama.cpp {test}{n} ({threads} thr)",
            "tok/s",
            statistics.median(ours[test]),
            statistics.median(theirs[test]),
            f"llama-bench -r {reps} samples, {model.name}",
            other,
            tuple(ours[test]),
            tuple(theirs[test]),
            statistics.median(means[test]),
        )
        for test, n in (("pp", pp), ("tg", tg))
    ]


# A repetition the suite would call disturbed is kept, as llama-bench keeps every sample: more
# foreign cores than the machine has can never be seen.
NO_RERUN = float(os.cpu_count() or 1) + 1.0


def _peers_round(model: Path, binary: Path, pp: int, tg: int, reps: int, threads: int) -> dict[str, float]:
    """One peers-suite run (OpScope and llama-bench interleaved, as a user runs it): the median tok/s
    of its llama_bench samples per test."""
    from opscope.engine.bench.measure.options import BenchOptions
    from opscope.engine.bench.session import run_suite
    from opscope.engine.bench.suites import get_suite

    params = get_suite("peers").Params(
        pp=pp, tg=tg, peers=("opscope", "llama_bench"), load_peers=(), llama_bench=str(binary)
    )
    opts = BenchOptions(
        quick=True, threads=threads, model=str(model), repeat=reps, min_time_s=0.0, load_threshold=NO_RERUN
    )
    _, result = run_suite("peers", opts, params=params)
    if result.status != "completed":
        raise RuntimeError(f"peers suite failed: {result.error}")
    by_name = {m.name: m.samples for m in result.metrics}
    return {test: statistics.median(by_name[f"{test}{n}.llama_bench"]) for test, n in (("pp", pp), ("tg", tg))}


def table(rows: list[Agreement]) -> str:
    la = load_average()
    lines = [f"{'what':<28} {'OpScope':>12} {'reference':>12} {'diff':>8}  ok  {'busy':>5}  reference", "-" * 100]
    for r in rows:
        lines.append(
            f"{r.what:<28} {r.opscope:>12.2f} {r.reference:>12.2f} {r.diff_pct:>+7.1f}%  "
            f"{'yes' if r.agrees else 'NO ':<3} {_cores(r.other_cores):>5}  {r.reference_name} ({r.unit})"
        )
    for r in rows:
        if r.opscope_rounds:
            ratios = " ".join(f"{a / b:.3f}" for a, b in zip(r.opscope_rounds, r.reference_rounds))
            mean = f"; llama-bench avg_ts {r.reference_mean:.2f}" if r.reference_mean is not None else ""
            lines.append(f"  {r.what}: OpScope/reference per round {ratios}{mean}")
    lines.append(
        f"tolerance ±{TOLERANCE_PCT:g}%; load average {la[0]:.2f} {la[1]:.2f} {la[2]:.2f} "
        f"on {os.cpu_count()} CPUs; busy: cores other processes kept busy meanwhile"
    )
    return "\n".join(lines)


def _cores(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2f}"
