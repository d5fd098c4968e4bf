"""The engine's public API: every name the app and plugins may use (an import-linter contract holds
them to it). Names are imported on first use, so `import opscope.engine` stays cheap (no torch).

    from opscope.engine import load, GenerationConfig, RunStore
"""

from __future__ import annotations

import importlib
from typing import Any

_E = "opscope.engine"
# name -> (module, attribute); attribute None: the module itself
_EXPORTS: dict[str, tuple[str, str | None]] = {
    # loading and generating
    "load": (f"{_E}.api", "load"),
    "open_model": (f"{_E}.formats", "open_model"),
    "permute_qk_rows": (f"{_E}.formats.gguf_source", "permute_qk_rows"),
    "GenerationConfig": (f"{_E}.generation.config", "GenerationConfig"),
    "stats_from_times": (f"{_E}.generation.events", "stats_from_times"),
    "prefix_cache": (f"{_E}.generation.prefix_cache", None),
    "COMPILE_MODES": (f"{_E}.models.compiled", "COMPILE_MODES"),
    "WOQ_MODES": (f"{_E}.models.woq", "WOQ_MODES"),
    "fastpath_settings": (f"{_E}.fastpath.options", None),
    "cpu_kernels": (f"{_E}.api", "cpu_kernels"),
    "kernel_build_key": (f"{_E}.fastpath.kernels.build", "build_key"),
    "kernel_cache_root": (f"{_E}.fastpath.kernels.build", "cache_root"),
    # backends (plugins)
    "API_VERSION": (f"{_E}.backends", "API_VERSION"),
    "Backend": (f"{_E}.backends", "Backend"),
    "BackendBase": (f"{_E}.backends", "BackendBase"),
    "DeviceInfo": (f"{_E}.backends", "DeviceInfo"),
    "OpEvent": (f"{_E}.backends", "OpEvent"),
    "check_prompt": (f"{_E}.backends", "check_prompt"),
    "get_backend": (f"{_E}.backends", "get_backend"),
    "list_backends": (f"{_E}.backends", "list_backends"),
    "stream_generation": (f"{_E}.backends", "stream_generation"),
    # the core: errors, clock, devices, units, results
    "EngineError": (f"{_E}.core.errors", "EngineError"),
    "BackendError": (f"{_E}.core.errors", "BackendError"),
    "ConfigError": (f"{_E}.core.errors", "ConfigError"),
    "DeviceError": (f"{_E}.core.errors", "DeviceError"),
    "ModelFormatError": (f"{_E}.core.errors", "ModelFormatError"),
    "UnsupportedModelError": (f"{_E}.core.errors", "UnsupportedModelError"),
    "Terminated": (f"{_E}.core.errors", "Terminated"),
    "Cancelled": (f"{_E}.core.errors", "Cancelled"),
    "now_ns": (f"{_E}.core.clock", "now_ns"),
    "markers": (f"{_E}.core.markers", None),
    "DTYPES": (f"{_E}.core.devices", "DTYPES"),
    "available_devices": (f"{_E}.core.devices", "available_devices"),
    "resolve_device": (f"{_E}.core.devices", "resolve_device"),
    "resolve_dtype": (f"{_E}.core.devices", "resolve_dtype"),
    "finite": (f"{_E}.core.json_output", "finite"),
    "Marker": (f"{_E}.core.results", "Marker"),
    "TelemetrySeries": (f"{_E}.core.results", "TelemetrySeries"),
    "RunResult": (f"{_E}.core.results", "RunResult"),
    "BYTE_UNITS": (f"{_E}.core.units", "BYTE_UNITS"),
    "display_scale": (f"{_E}.core.units", "display_scale"),
    "format_rate": (f"{_E}.core.units", "format_rate"),
    # telemetry
    "Recorder": (f"{_E}.telemetry", "Recorder"),
    "Sampler": (f"{_E}.telemetry", "Sampler"),
    "Source": (f"{_E}.telemetry", "Source"),
    "default_sources": (f"{_E}.telemetry", "default_sources"),
    "write_csv": (f"{_E}.telemetry", "write_csv"),
    "energy_short_reason": (f"{_E}.telemetry.energy", "short_reason"),
    "NVML_REASON_BITS": (f"{_E}.telemetry.nvml", "REASON_BITS"),
    # benchmarks
    "BenchOptions": (f"{_E}.bench.measure.options", "BenchOptions"),
    "SUITES": (f"{_E}.bench.suites", "SUITES"),
    "get_suite": (f"{_E}.bench.suites", "get_suite"),
    "run_suite": (f"{_E}.bench.session", "run_suite"),
    "build_params": (f"{_E}.bench.measure.params", "build_params"),
    "param_doc": (f"{_E}.bench.measure.params", "param_doc"),
    "override_cli_params": (f"{_E}.bench.measure.params", "override_cli_params"),
    "QUALITIES": (f"{_E}.bench.measure.quality", "QUALITIES"),
    "summarize": (f"{_E}.bench.measure.stats", "summarize"),
    "roofline": (f"{_E}.bench.ceilings.roofline", None),
    "Roofline": (f"{_E}.bench.ceilings.roofline", "Roofline"),
    "ROOFLINE_SUITES": (f"{_E}.bench.ceilings.roofline", "SUITES"),
    "estimate_run": (f"{_E}.bench.estimate", "estimate_run"),
    "last_run_here": (f"{_E}.bench.estimate", "last_run_here"),
    "duration_text": (f"{_E}.bench.estimate", "duration_text"),
    "took_text": (f"{_E}.bench.estimate", "took_text"),
    "Side": (f"{_E}.bench.ab", "Side"),
    "pair_names": (f"{_E}.bench.ab", "pair_names"),
    "run_ab": (f"{_E}.bench.ab", "run_ab"),
    "ab_side": (f"{_E}.cli.commands.bench", "ab_side"),
    # the run store
    "RunStore": (f"{_E}.store", "RunStore"),
    "store_db": (f"{_E}.store.db", None),
    "compare": (f"{_E}.store.compare", "compare"),
    "export_csv": (f"{_E}.store.convert", "export_csv"),
    "push_runs": (f"{_E}.store.push", "push_runs"),
    "render_comparison": (f"{_E}.store.render", "render"),
    "cell_text": (f"{_E}.store.render", "cell_text"),
    "delta_text": (f"{_E}.store.render", "delta_text"),
    "disturbed_text": (f"{_E}.store.render", "disturbed_text"),
    "compare_footnotes": (f"{_E}.store.render", "footnotes"),
    "FEW_MARK": (f"{_E}.store.render", "FEW_MARK"),
    "NOISY_MARK": (f"{_E}.store.render", "NOISY_MARK"),
    "DISTURBED_MARK": (f"{_E}.store.render", "DISTURBED_MARK"),
    "fmt_unit_value": (f"{_E}.store.render", "fmt_unit_value"),
    # trace
    "TraceOptions": (f"{_E}.trace.events", "TraceOptions"),
    "write_chrome_trace": (f"{_E}.trace.export", "write_chrome_trace"),
    "build_report": (f"{_E}.trace.report", "build_report"),
    "trace_generation": (f"{_E}.trace.session", "trace_generation"),
    "TRACE_VARIANTS": (f"{_E}.trace.variants", "VARIANTS"),
    "trace_runs": (f"{_E}.trace.runs", None),
    "save_trace_run": (f"{_E}.trace.runs", "save"),
    "backend_ops": (f"{_E}.trace.backend_ops", None),
    # diagnose
    "DiagnosisPlan": (f"{_E}.diagnose.measure", "ModelPlan"),
    "diagnose_model": (f"{_E}.diagnose.session", "diagnose_model"),
    "DiagnosisStages": (f"{_E}.diagnose.measure", "Stages"),
    "render_diagnosis": (f"{_E}.diagnose.report", "render_text"),
    # the command line (the app's `opscope` entry point hands its commands over)
    "cli_main": (f"{_E}.cli.main", "main"),
    "command_word": (f"{_E}.cli.main", "command_word"),
    "stderr_line": (f"{_E}.cli.args", "stderr_line"),
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'opscope.engine' has no attribute {name!r}")
    module, attr = _EXPORTS[name]
    value = importlib.import_module(module)
    return value if attr is None else getattr(value, attr)
