"""Live telemetry, headless: GPU (NVML, amdsmi), host (psutil) and allocators (torch, MLX) sampled
on the engine clock, with the engine's phase markers on the same axis.

    from opscope.engine.telemetry import Sampler, Recorder
    sampler = Sampler(interval_ms=100).start()          # default sources, 10 Hz, 1 h of history
    unsubscribe = sampler.subscribe(on_snapshot)         # called on the sampler thread
    t_ns, values = sampler.series("gpu0.util_pct")       # numpy arrays, NaN = not available
    sampler.stop()

See docs/telemetry.md.
"""

from opscope.engine.telemetry.base import NA, Snapshot, Source, to_float
from opscope.engine.telemetry.export import CsvSink, read_json, to_json_dict, write_csv, write_json
from opscope.engine.telemetry.recorder import Recorder
from opscope.engine.telemetry.sampler import MAX_INTERVAL_MS, MIN_INTERVAL_MS, Sampler
from opscope.engine.telemetry.sources import default_sources
from opscope.engine.telemetry.summary import PhaseSummary, SeriesSummary, pair_phases, summarize

__all__ = [
    "NA",
    "Snapshot",
    "Source",
    "to_float",
    "CsvSink",
    "read_json",
    "to_json_dict",
    "write_csv",
    "write_json",
    "Recorder",
    "Sampler",
    "MIN_INTERVAL_MS",
    "MAX_INTERVAL_MS",
    "default_sources",
    "PhaseSummary",
    "SeriesSummary",
    "pair_phases",
    "summarize",
]
