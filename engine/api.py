"""The engine's public entry point: load a model, then generate or chat with it.

lm = load()                                   # the embedded default model, CPU, float32
for ev in lm.chat([{"role": "user", "content": "Hi"}], GenerationConfig(max_tokens=32)):
    ...                                       # engine.events: PrefillStarted … Token … Finished
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from opscope.engine.core.devices import resolve_dtype
from opscope.engine.core.errors import ConfigError
from opscope.engine.core.gcpause import gc_paused
from opscope.engine.generation.generate import GenerationConfig
from opscope.engine.generation.loaded import LoadedModel, LoadOptions, load_plain

if TYPE_CHECKING:
    from opscope.engine.fastpath import FastPathOptions

log = logging.getLogger(__name__)

__all__ = ["GenerationConfig", "LoadOptions", "LoadedModel", "fastpath_options", "load"]


def _spec(options) -> str:
    from dataclasses import asdict, fields

    from opscope.engine.fastpath import FastPathOptions

    default = FastPathOptions()
    changed = [f"{f.name}={v}" for f in fields(options) if (v := asdict(options)[f.name]) != getattr(default, f.name)]
    return "on" + (f" ({', '.join(changed)})" if changed else "")


def fastpath_options(spec, device: str, dtype: str, model) -> FastPathOptions | None:
    """The fast-path options a load should use, or None for the plain torch model.

    ``spec``: "auto" (default: the CPU fast path for a GGUF on the CPU in float32 or bfloat16 — the
    fastest correct choice measured, see benchmarks/FASTPATH_NOTES.md), "off"/"dense", a
    FastPathOptions, or a string like "activations=q8,prefill_dtype=bf16". In bfloat16 the fast path
    keeps float32 activations and exact decode kernels and runs prefill GEMMs in bf16 (where the CPU
    has native bf16), as the plain model's bf16 policy does (engine.models.llama.activation_dtype)."""
    import torch
    from opscope.engine.fastpath import FastPathOptions

    if isinstance(spec, FastPathOptions):
        return spec
    spec = (spec or "auto").strip()
    if spec in ("off", "dense", "none"):
        return None
    dt = resolve_dtype(dtype)
    if str(device) != "cpu" or dt not in (torch.float32, torch.bfloat16):
        if spec == "auto":
            return None
        raise ConfigError.about_options(
            "{fastpath}: the CPU fast path runs on {device=cpu} in float32 or bfloat16; use {fastpath=off}"
        )
    prefill = _prefill_dtype(spec, dt == torch.bfloat16)
    base = FastPathOptions(prefill_dtype=prefill, activations="q8" if prefill == "int8" else "f32")
    if spec == "auto":
        from pathlib import Path

        is_gguf = model is None or str(model).endswith(".gguf") or (Path(model).is_file())
        return base if is_gguf and _kernels_beat_torch() else None
    return FastPathOptions.from_string(spec, base)


def _prefill_dtype(spec: str, bf16_model: bool) -> str:
    """The prefill GEMMs' dtype unless ``spec`` names one: with int8 activations int8 where the
    kernels have that GEMM (every variant with int8 kernels; the int8 activations' own error);
    else bf16 where the CPU multiplies it natively and the run has already chosen a lower precision
    (a bfloat16 model, or int8 activations), else f32. Measurements: docs/decisions/cpu-variants.md."""
    from opscope.engine.fastpath import FastPathOptions

    q8 = spec != "auto" and FastPathOptions.from_string(spec).activations == "q8"
    if not (bf16_model or q8):
        return "f32"
    from opscope.engine.fastpath.kernels import int8_prefill, native_bf16

    if q8 and int8_prefill():  # llama.cpp's prefill scheme for a run that chose its decode scheme
        return "int8"
    return "bf16" if native_bf16() else "f32"


def _kernels_beat_torch() -> bool:
    """Whether this CPU's kernel variant decodes faster than plain torch: not the portable
    baseline (a CPU without AVX2+FMA+F16C). Measured: the embedded model, one thread, baseline
    variant 4.4 tok/s against 8.7 for plain torch (docs/decisions/cpu-variants.md), so "auto" takes
    the plain path there; an explicit --fastpath spec still runs the kernels."""
    from opscope.engine.fastpath.kernels import variants

    try:
        v = variants.chosen()
    except variants.VariantError:
        return True  # the fast-path load says why in one line and falls back itself
    if v.name == "baseline":
        log.info("fast path off: the %s kernels decode slower than plain torch on this CPU", v.name)
        return False
    return True


def load(
    model=None,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    attention: str = "sdpa",
    threads: int | None = None,
    fastpath="auto",
    compile: str = "off",
    quantize: str = "off",
) -> LoadedModel:
    """Load ``model`` (a .gguf file or HF directory; None = the embedded default) onto ``device``.
    ``fastpath`` picks the CPU fast path (engine.fastpath) or the plain torch model ("off");
    ``compile="decode"`` runs the plain model's decode steps through torch.compile
    (engine.models.compiled); ``quantize="int8"|"int4"`` stores the plain model's layer weights
    weight-only quantized (engine.models.woq). Garbage collection is paused while it loads
    (engine.core.gcpause: a vocabulary's objects would set off full collections that free nothing)."""
    with gc_paused():
        return _load(model, device, dtype, attention, threads, fastpath, compile, quantize)


def _load(model, device, dtype, attention, threads, fastpath, compile, quantize) -> LoadedModel:
    from opscope.engine.models.compiled import COMPILE_MODES
    from opscope.engine.models.woq import WOQ_MODES

    if compile not in COMPILE_MODES:
        raise ConfigError.about_options(f"{{compile=}} is not one of {', '.join(COMPILE_MODES)}", compile=compile)
    if quantize not in WOQ_MODES:
        raise ConfigError.about_options(f"{{quantize=}} is not one of {', '.join(WOQ_MODES)}", quantize=quantize)
    if (compile != "off" or quantize != "off") and fastpath == "auto":
        fastpath = "off"  # the compiled step and weight-only quantization belong to the plain torch model
    options = fastpath_options(fastpath, device, dtype, model)
    if options is not None and (compile != "off" or quantize != "off"):
        raise ConfigError.about_options(
            "{compile} and {quantize} apply to the plain torch model; add "
            "{fastpath=off} (the fast path keeps the GGUF's own quantized blocks)"
        )
    if options is not None:
        from opscope.engine.fastpath import load as load_fast

        lm = load_fast(model, options, attention=attention, threads=threads)
        spec = _spec(options)
        lm.options = LoadOptions(device, dtype, attention, threads, fastpath=spec, cpu_kernels=cpu_kernels(spec))
        return lm
    return load_plain(
        model, device=device, dtype=dtype, attention=attention, threads=threads, compile=compile, quantize=quantize
    )


def cpu_kernels(fastpath: str) -> str | None:
    """The kernel variant the fast path runs (engine.fastpath.kernels.variants), None on the plain path."""
    if not str(fastpath).startswith("on"):
        return None
    from opscope.engine.fastpath.kernels.build import loaded_variant

    return loaded_variant()
