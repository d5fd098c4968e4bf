"""What a run produces, independent of where it is stored.

A benchmark suite fills a RunResult; engine.store saves it; comparison reads it back. Every metric
keeps its raw per-repetition samples: summaries are always recomputed from them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

RUN_NAME_MAX_CHARS = 200  # the store and `--name` take the same names


@dataclass
class Metric:
    name: str  # e.g. "pp512", "tg128", "ttft", "matmul_bf16_4096"
    unit: str  # e.g. "tok/s", "ms", "GFLOP/s", "GB/s", "bytes"
    samples: list[float] = field(default_factory=list)  # raw, one per repetition
    higher_is_better: bool = True
    params: dict[str, Any] = field(default_factory=dict)  # point parameters (size, dtype, batch, ...)
    status: str = "ok"  # "ok" | "failed"
    error: str | None = None  # why a failed point failed (e.g. "out of memory")
    # "ok" | "noisy" | "disturbed" (engine.bench.quality); None: not measured by the runner, or old
    quality: str | None = None
    # foreign load while the samples were taken: {"other_cores": [per sample], "rerun": n, ...}
    load: dict[str, Any] | None = None


@dataclass
class Marker:
    phase: str
    edge: str
    t_ns: int
    attrs: dict[str, Any] = field(default_factory=dict)


@dataclass
class TelemetrySeries:
    name: str  # e.g. "gpu0.util_pct", "host.cpu_pct"
    unit: str
    t_ns: list[int] = field(default_factory=list)
    values: list[float] = field(default_factory=list)


@dataclass
class RunResult:
    kind: str  # suite name: "llm", "matmul", ... or "trace", "generate"
    name: str = ""
    tags: list[str] = field(default_factory=list)
    notes: str = ""
    settings: dict[str, Any] = field(default_factory=dict)  # every engine setting that can change a number
    fingerprint: dict[str, Any] = field(default_factory=dict)  # environment (engine.bench.fingerprint)
    metrics: list[Metric] = field(default_factory=list)
    telemetry: list[TelemetrySeries] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    trace_summary: dict[str, Any] | None = None
    status: str = "completed"  # "running" | "completed" | "failed" | "aborted"
    error: str | None = None
    quality: str | None = None  # the worst of the metrics' (engine.bench.quality)
    # When the run began and ended (aware UTC datetimes); None: when it is saved. A run saved after it
    # ended (a script trace) sets them, or its duration reads 0 s.
    started_at: Any = None
    finished_at: Any = None
