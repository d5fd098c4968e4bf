"""The short probes a diagnosis takes beside its measurement: the ceilings (stored peaks, else a short
copy for the bandwidth), the host cost of one op, other processes' load, and where the host's
Python is while no op runs (stack samples)."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass

from opscope.engine.diagnose.measurement import Neighbour

log = logging.getLogger(__name__)

PROBE_BYTES = {"cpu": 64 * 2**20, "cuda": 1 << 30}  # the bandwidth probe's copy: well past the caches
PROBE_N = {"cpu": 1024, "cuda": 8192}  # the matmul probe's size: long enough to reach the device's pace
PROBE_REPS = 5


@dataclass(frozen=True)
class Ceilings:
    flop_s: float | None = None
    flop_label: str = ""
    bytes_s: float | None = None
    bytes_label: str = ""


def ceilings(device: str, dtype: str) -> Ceilings:
    """The compute and bandwidth ceilings: a stored measured peak where there is one
    (engine.bench.ceilings.peaks), else a short probe taken now (a matmul, a copy), labelled so. Not
    the theoretical peak: torch on a CPU reaches a fraction of it, and a roof nothing can reach
    would call every prefill memory-bound."""
    from opscope.engine.bench.ceilings import peaks

    if device == "meta":
        return Ceilings()
    flop = peaks.measured(device, "matmul", dtype)
    bw = peaks.measured(device, "bandwidth")
    flop_s, flop_label = (flop.value, f"{flop.label} peak") if flop else _probe_matmul(device, dtype)
    bytes_s, bytes_label = (bw.value, f"{bw.label} peak") if bw else _probe_bandwidth(device)
    return Ceilings(flop_s, flop_label, bytes_s, bytes_label)


def _best_s(device: str, fn) -> float:
    best = float("inf")
    for _ in range(PROBE_REPS):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def _probe_matmul(device: str, dtype: str, n: int = 1024) -> tuple[float, str]:
    """Best of a few n×n matmuls (2·n³ FLOP), as `opscope bench matmul` counts them."""
    import torch
    from opscope.engine.core.units import format_rate

    a = torch.randn(n, n, device=device).to(getattr(torch, dtype))
    value = 2 * n**3 / _best_s(device, lambda: a @ a)
    return (
        value,
        f"{format_rate(value, 'FLOP/s', 3)} {dtype} of a {n}² matmul probed now (no stored peak: `opscope bench matmul`)",
    )


def _probe_bandwidth(device: str) -> tuple[float, str]:
    """Best of a few 64 MiB copies, read + written bytes (as `opscope bench bandwidth` counts them)."""
    import torch
    from opscope.engine.core.units import format_rate

    size = PROBE_BYTES.get(device.split(":")[0], PROBE_BYTES["cpu"])
    src = torch.ones(size // 4, device=device)
    dst = torch.empty_like(src)
    value = 2 * size / _best_s(device, lambda: dst.copy_(src))
    return value, (
        f"{format_rate(value, 'B/s', 3)} of a {size >> 20} MiB copy probed now "
        f"(no stored peak: `opscope bench bandwidth`)"
    )


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


def dispatch_us(device: str, n: int = 50, rounds: int = 20) -> float | None:
    """Host cost of issuing one op that does no work, through a module as a model issues it (an
    nn.Linear(1, 1) on one element; µs): the floor under every op of a pass. The best of many short
    rounds, so that a round another process preempted does not count."""
    if device == "meta":
        return None
    import torch

    lin = torch.nn.Linear(1, 1).to(device)
    x = torch.ones(1, 1, device=device)
    best = float("inf")
    with torch.inference_mode():
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(n):
                lin(x)
            best = min(best, (time.perf_counter() - t0) / n)
    _sync(device)
    return best * 1e6


@dataclass(frozen=True)
class MatvecModes:
    """One pass over the fast path's decode matvecs, in each activation mode (ms), and their types."""

    exact_ms: float
    int8_ms: float
    types: str


def matvec_modes(model, rounds: int = 3) -> MatvecModes | None:
    """Time the decode's matvecs of a fast-path model that runs them in exact float32 (every
    QuantLinear with act_mode 0 whose type has an int8 kernel on this CPU), once per round in each
    activation mode, alternating; the best pass of each. None where there is nothing to compare (the
    plain torch model, activations=q8 already, no int8 kernels here)."""
    import torch
    from opscope.engine.fastpath.qlinear import QuantLinear

    layers = [m for m in model.modules() if isinstance(m, QuantLinear) and m.act_mode == 0 and m.int8_kernel]
    if not layers:
        return None
    xs = {k: torch.randn(1, k) for k in {m.in_features for m in layers}}
    weights: Counter[str] = Counter()
    for m in layers:
        weights[m.ggml_type] += m.in_features * m.out_features
    best = {0: float("inf"), 1: float("inf")}
    with torch.inference_mode():
        for _ in range(rounds):
            for mode in (0, 1):
                t0 = time.perf_counter()
                for m in layers:
                    m.matvec(xs[m.in_features], mode)
                best[mode] = min(best[mode], time.perf_counter() - t0)
    types = ", ".join(t for t, _ in weights.most_common())
    return MatvecModes(best[0] * 1000.0, best[1] * 1000.0, types)


class LoadWatch:
    """Other processes' CPU load over the measurement (engine.core.cpuload through run quality's
    /proc), the GPU's other processes, and which processes they were."""

    def __init__(self, device: str):
        from opscope.engine.bench.measure.quality import gpu_probe, proc_root
        from opscope.engine.core.cpuload import OtherLoad

        self.load = OtherLoad(proc_root())
        self.gpu = gpu_probe(device)
        self._times = _cpu_times()

    def finish(self) -> tuple[float | None, int | None, tuple[Neighbour, ...]]:
        cores = self.load.cores()
        gpu = self.gpu.count() if self.gpu else None
        return cores, gpu, _neighbours(self._times, _cpu_times(), self.load)


def _cpu_times() -> tuple[float, dict[int, tuple[str, float]]]:
    import psutil

    out = {}
    for p in psutil.process_iter(["name", "cpu_times"]):
        t = p.info.get("cpu_times")
        if t is not None:
            out[p.pid] = (p.info.get("name") or "?", t.user + t.system)
    return time.monotonic(), out


def _neighbours(before, after, load, top: int = 16) -> tuple[Neighbour, ...]:
    """The processes other than ours that used the most CPU between two snapshots (at least 0.05
    cores: on a shared machine a busy neighbour may get a small share of its own)."""
    (t0, a), (t1, b) = before, after
    span = max(t1 - t0, 1e-3)
    mine = os.getpid()
    used = [
        Neighbour(pid, name, (cpu - a[pid][1]) / span) for pid, (name, cpu) in b.items() if pid in a and pid != mine
    ]
    used = [n for n in used if n.cores >= 0.05]
    return tuple(sorted(used, key=lambda n: -n.cores)[:top])


class StackSampler:
    """Samples the main thread's Python stack every ``interval_s``: where the host is while no
    tensor op runs. A sample is *in ops* when any frame is torch's or OpScope's (the trace's dispatch
    hook runs inside every op); otherwise it is charged to the innermost frame of the user's code."""

    def __init__(self, interval_s: float = 0.002):
        self.interval_s = interval_s
        self.samples: list[tuple[int, str | None]] = []  # (ns, user file:line or None when in ops)
        self._main = threading.main_thread().ident or 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="opscope-diagnose-stacks", daemon=True)

    def __enter__(self) -> StackSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)

    def _run(self) -> None:
        from opscope.engine.core.clock import now_ns

        while not self._stop.wait(self.interval_s):
            frame = sys._current_frames().get(self._main)
            if frame is not None:
                self.samples.append((now_ns(), _user_site(frame)))

    def idle(self, since_ns: int) -> tuple[float | None, str, float]:
        """(% of samples after ``since_ns`` outside any op, the top user line then, its % of them)."""
        after = [site for t, site in self.samples if t >= since_ns]
        if len(after) < 5:
            return None, "", 0.0
        user = Counter(site for site in after if site is not None)
        n_user = sum(user.values())
        if not n_user:
            return 0.0, "", 0.0
        line, count = user.most_common(1)[0]
        return 100.0 * n_user / len(after), line, 100.0 * count / n_user


def _machinery() -> tuple[str, ...]:
    import torch

    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # engine/
    return os.path.dirname(os.path.abspath(torch.__file__)), here


def _user_site(frame) -> str | None:
    """The innermost frame of the user's code, as file:line; None while torch or OpScope runs
    inside it (an op, the trace's hook) or no user frame is on the stack."""
    from opscope.engine.trace.source import short_path

    skip = _machinery()
    f = frame
    while f is not None:
        name = os.path.abspath(f.f_code.co_filename)
        if name.startswith(skip):
            return None
        if not _library(name):
            return f"{short_path(name)}:{f.f_lineno}"
        f = f.f_back
    return None


def _library(path: str) -> bool:
    """The standard library and installed packages: not the user's code, not torch either."""
    return path.startswith((sys.base_prefix, sys.prefix, "<")) or "site-packages" in path
