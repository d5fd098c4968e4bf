"""The engine's public entry point: load a model, then generate or chat with it.

    lm = load()                                   # the embedded default model, CPU, float32
    for ev in lm.chat([{"role": "user", "content": "Hi"}], GenerationConfig(max_tokens=32)):
        ...                                       # engine.events: PrefillStarted … Token … Finished
"""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import Iterator

from engine import markers
from engine.clock import now_ns
from engine.errors import ConfigError
from engine.generate import GenerationConfig, generate
from engine.devices import resolve_device, resolve_dtype

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadOptions:
    device: str = "cpu"
    dtype: str = "float32"
    attention: str = "sdpa"
    threads: int | None = None
    fastpath: str = "off"
    compile: str = "off"
    quantize: str = "off"


class LoadedModel:
    """A model on a device with its tokenizer; every generation path yields engine.events."""

    backend_name = "torch"

    def __init__(self, source, model, options: LoadOptions, load_ms: float):
        self.source, self.model, self.options, self.load_ms = source, model, options, load_ms
        self.tokenizer = source.tokenizer
        self.config = source.config
        self.device = model.embed.weight.device
        self.dtype = model.embed.weight.dtype

    def generate(self, prompt: str | list[int], config: GenerationConfig = GenerationConfig(),
                 cancel: threading.Event | None = None) -> Iterator:
        request_ns = now_ns()
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        self._check_ids(ids)
        return generate(self.model, self.tokenizer, ids, config, cancel, request_ns)

    def chat(self, messages: list[dict], config: GenerationConfig = GenerationConfig(),
             cancel: threading.Event | None = None) -> Iterator:
        request_ns = now_ns()
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return generate(self.model, self.tokenizer, ids, config, cancel, request_ns)

    def generate_batch(self, prompts: list[str | list[int]], config: GenerationConfig = GenerationConfig(),
                       cancel: threading.Event | None = None) -> Iterator:
        from engine.batch import generate_batch

        ids = [self.tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompts]
        for one in ids:
            self._check_ids(one)
        return generate_batch(self.model, self.tokenizer, ids, config, cancel)

    def logits(self, ids: list[int]):
        """Float32 logits [T, V] of a full forward pass without the cache (reference tests)."""
        import torch

        self._check_ids(ids)
        cache = [layer.attn.cache for layer in self.model.layers]
        self.model.drop_cache()
        try:
            with torch.inference_mode():
                x = torch.tensor([ids], device=self.device)
                return self.model(x, 0)[0].float()
        finally:
            for layer, c in zip(self.model.layers, cache):
                layer.attn.cache = c
            self.model.max_cache_len = cache[0].k.shape[1] if cache[0] is not None else 0

    def _check_ids(self, ids: list[int]) -> None:
        bad = [i for i in ids if not 0 <= i < self.config.vocab_size]
        if bad:
            raise ConfigError(f"token id {bad[0]} is outside the vocabulary (0..{self.config.vocab_size - 1})")

    def memory_stats(self) -> dict:
        import psutil
        import torch

        weights = sum(t.numel() * t.element_size() for t in _unique_tensors(self.model))
        cache = self.model.layers[0].attn.cache
        kv = 2 * len(self.model.layers) * cache.k.numel() * cache.k.element_size() if cache is not None else 0
        stats = {"weights_bytes": weights, "kv_cache_bytes": kv,
                 "rss_bytes": psutil.Process().memory_info().rss}
        if self.device.type == "cuda":
            stats |= {"cuda_allocated_bytes": torch.cuda.memory_allocated(self.device),
                      "cuda_reserved_bytes": torch.cuda.memory_reserved(self.device),
                      "cuda_peak_bytes": torch.cuda.max_memory_allocated(self.device)}
        return stats

    def describe(self) -> dict:
        return {"model": str(self.source.path), "format": self.source.format, "arch": self.config.arch,
                "device": str(self.device), "dtype": str(self.dtype).removeprefix("torch."),
                "attention": self.options.attention, "threads": _threads(), "backend": self.backend_name,
                "fastpath": self.options.fastpath}


def _unique_tensors(model):
    """Parameters and buffers (the fast path keeps packed weights as buffers), each once; the KV
    cache is counted separately."""
    seen = set()
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if id(t) not in seen and ".cache." not in name and not name.startswith("inv_freq"):
            seen.add(id(t))
            yield t


def _spec(options) -> str:
    from dataclasses import asdict, fields

    from engine.fastpath import FastPathOptions

    default = FastPathOptions()
    changed = [f"{f.name}={v}" for f in fields(options) if (v := asdict(options)[f.name]) != getattr(default, f.name)]
    return "on" + (f" ({', '.join(changed)})" if changed else "")


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def fastpath_options(spec, device: str, dtype: str, model) -> "object | None":
    """The fast-path options a load should use, or None for the plain torch model.

    ``spec``: "auto" (default: the CPU fast path for a GGUF on the CPU in float32 or bfloat16 — the
    fastest correct choice measured, see benchmarks/FASTPATH_NOTES.md), "off"/"dense", a
    FastPathOptions, or a string like "activations=q8,prefill_dtype=bf16". In bfloat16 the fast path
    keeps float32 activations and exact decode kernels and runs prefill GEMMs in bf16 (where the CPU
    has native bf16), as the plain model's bf16 policy does (engine.models.llama.activation_dtype)."""
    import torch

    from engine.fastpath import FastPathOptions

    if isinstance(spec, FastPathOptions):
        return spec
    spec = (spec or "auto").strip()
    if spec in ("off", "dense", "none"):
        return None
    dt = resolve_dtype(dtype)
    if str(device) != "cpu" or dt not in (torch.float32, torch.bfloat16):
        if spec == "auto":
            return None
        raise ConfigError("--fastpath: the CPU fast path runs on --device cpu in float32 or bfloat16; "
                          "use --fastpath off")
    base = FastPathOptions()
    if dt == torch.bfloat16:
        from engine.kernels import native_bf16

        base = FastPathOptions(prefill_dtype="bf16" if native_bf16() else "f32")
    if spec == "auto":
        from pathlib import Path

        is_gguf = model is None or str(model).endswith(".gguf") or (Path(model).is_file())
        return base if is_gguf else None
    return FastPathOptions.from_string(spec, base)


def load(model=None, *, device: str = "cpu", dtype: str = "float32", attention: str = "sdpa",
         threads: int | None = None, fastpath="auto", compile: str = "off", quantize: str = "off") -> LoadedModel:
    """Load ``model`` (a .gguf file or HF directory; None = the embedded default) onto ``device``.
    ``fastpath`` picks the CPU fast path (engine.fastpath) or the plain torch model ("off");
    ``compile="decode"`` runs the plain model's decode steps through torch.compile
    (engine.models.compiled); ``quantize="int8"|"int4"`` stores the plain model's layer weights
    weight-only quantized (engine.models.woq)."""
    import torch

    from engine.formats import open_model
    from engine.models.compiled import COMPILE_MODES, enable_compiled_decode
    from engine.models.llama import ATTENTION_IMPLS
    from engine.models.loader import build_model
    from engine.models.woq import WOQ_MODES, quantize_weights

    if compile not in COMPILE_MODES:
        raise ConfigError(f"--compile {compile!r} is not one of {', '.join(COMPILE_MODES)}")
    if quantize not in WOQ_MODES:
        raise ConfigError(f"--quantize {quantize!r} is not one of {', '.join(WOQ_MODES)}")
    if (compile != "off" or quantize != "off") and fastpath == "auto":
        fastpath = "off"  # the compiled step and weight-only quantization belong to the plain torch model
    options = fastpath_options(fastpath, device, dtype, model)
    if options is not None and (compile != "off" or quantize != "off"):
        raise ConfigError("--compile and --quantize apply to the plain torch model; add --fastpath off "
                          "(the fast path keeps the GGUF's own quantized blocks)")
    if options is not None:
        from engine.fastpath import load as load_fast

        lm = load_fast(model, options, attention=attention, threads=threads)
        lm.options = LoadOptions(device, dtype, attention, threads, fastpath=_spec(options))
        return lm
    if attention not in ATTENTION_IMPLS:
        raise ConfigError(f"--attention {attention!r} is not one of {', '.join(ATTENTION_IMPLS)}")
    if threads is not None:
        if threads < 1:
            raise ConfigError(f"--threads must be at least 1, got {threads}")
        torch.set_num_threads(threads)
    dev, dt = resolve_device(device), resolve_dtype(dtype)
    t0 = now_ns()
    with markers.phase(markers.MODEL_LOAD, model=str(model or "default")):
        source = open_model(model)
        net = quantize_weights(build_model(source, dev, dt, attention), quantize)
    if quantize != "off" and dev.type == "cpu":
        log.warning("--quantize %s is the GPU path; on the CPU the default fast path is faster "
                    "(it keeps the GGUF's own blocks)", quantize)
    if dev.type == "cpu":
        net.decode_threads = 1  # see engine.generate.decode_threads
    if compile == "decode":
        enable_compiled_decode(net)
    load_ms = (now_ns() - t0) / 1e6
    log.info("loaded %s on %s/%s in %.0f ms", source.path, dev, dt, load_ms)
    options = LoadOptions(device, dtype, attention, threads, compile=compile, quantize=quantize)
    return LoadedModel(source, net, options, load_ms)


os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
