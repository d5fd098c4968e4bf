"""What a user chooses for a benchmark run, and the plan a suite makes from it."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from opscope.engine.bench.measure.runner import QUICK, QUICK_MIN_REPS, Point, PointOutcome, RunnerConfig
from opscope.engine.bench.measure.stats import min_samples_per_side
from opscope.engine.core.errors import ConfigError
from opscope.engine.core.results import Metric

log = logging.getLogger(__name__)

DTYPE_ALIASES = {
    "float32": "float32",
    "fp32": "float32",
    "f32": "float32",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "f16": "float16",
    "half": "float16",
}
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def canonical_dtype(name: str) -> str:
    try:
        return DTYPE_ALIASES[name.lower()]
    except KeyError as e:
        raise ConfigError(f"unknown dtype {name!r}: use float32, bfloat16 or float16") from e


def torch_dtype(name: str):
    import torch

    return getattr(torch, canonical_dtype(name))


@dataclass(frozen=True)
class BenchOptions:
    device: str = "cpu"
    dtype: str = "float32"
    quick: bool = False
    model: str | None = None  # None: the embedded default model (suites that need one)
    backend: str = "torch"
    threads: int | None = None
    attention: str = "sdpa"
    fastpath: str = "auto"  # engine.api.load's fast-path setting (auto, off, or a settings string)
    compile: str = "off"  # engine.api.load's compile setting (off, decode)
    quantize: str = "off"  # engine.api.load's weight-only quantization (off, int8, int4)
    repeat: int | None = None  # minimum repetitions per point (overrides the suite's default)
    min_time_s: float | None = None
    warmup: int | None = None
    load_threshold: float | None = None  # foreign CPU cores that make a repetition disturbed (None: default)

    def __post_init__(self):
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))
        if self.repeat is not None and self.repeat < 1:
            raise ConfigError(f"--repeat must be at least 1, got {self.repeat}")
        if self.load_threshold is not None and not self.load_threshold > 0:
            raise ConfigError(f"--load-threshold must be a number of cores above 0, got {self.load_threshold}")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"--threads must be at least 1, got {self.threads}")
        if self.repeat is not None and self.repeat < min_samples_per_side(0.05):
            log.warning(
                "--repeat %d: with fewer than %d samples per point no comparison of this run can "
                "reach p < 0.05 (Mann-Whitney); %d or more recommended",
                self.repeat,
                min_samples_per_side(0.05),
                QUICK_MIN_REPS,
            )

    def runner_config(self) -> RunnerConfig:
        base = QUICK if self.quick else RunnerConfig()
        min_reps = self.repeat or base.min_reps
        return RunnerConfig(
            warmup=base.warmup if self.warmup is None else self.warmup,
            min_reps=min_reps,
            min_time_s=base.min_time_s if self.min_time_s is None else self.min_time_s,
            max_reps=max(base.max_reps, min_reps),
            min_rep_s=base.min_rep_s,
            disturbed_cores=base.disturbed_cores if self.load_threshold is None else self.load_threshold,
            budget_s=base.budget_s,
        )

    def as_settings(self) -> dict[str, Any]:
        return asdict(self) | {"runner": asdict(self.runner_config())}


def check_torch_device(device: str):
    """The torch.device for ``device``, or a DeviceError saying why it cannot be used."""
    from opscope.engine.core.devices import resolve_device

    return resolve_device(device)


def free_memory_bytes(device: str) -> int:
    """Memory that a new allocation on ``device`` can use now."""
    import torch

    dev = torch.device(device)
    if dev.type == "cuda":
        return int(torch.cuda.mem_get_info(dev)[0])
    import psutil

    return int(psutil.virtual_memory().available)


@dataclass
class SuitePlan:
    """What a suite will run: points (a list, or a generator that reads ``outcomes`` as they land,
    to skip sizes that earlier points show cannot finish), settings, and a hook that derives
    suite-level metrics (e.g. % of peak) once every point is done."""

    points: Iterable[Point]
    n_points: int
    settings: dict[str, Any] = field(default_factory=dict)
    model_source: Any = None
    outcomes: list[PointOutcome] = field(default_factory=list)
    finish: Callable[..., list[Metric]] | None = None  # (outcomes[, progress=]) → metrics
    close: Callable[[], None] | None = None  # frees what the plan holds (a loaded model)
    # A plan that measures in ``finish`` (collectives: the ranks run the whole sweep there) is
    # called ``finish(outcomes, progress=...)`` with the run's progress callback, and leaves the
    # markers it recorded (every rank's timed calls) in ``markers``, saved with the run.
    finish_reports_progress: bool = False
    markers: list = field(default_factory=list)
