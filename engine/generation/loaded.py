"""A loaded model (LoadedModel, LoadOptions) and the loader of the plain torch model (load_plain).

Below engine.api and engine.fastpath, so that both can build a LoadedModel: api.load picks the
fast path (engine.fastpath.load) or load_plain, and the fast path falls back to load_plain.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opscope.engine.core import markers
from opscope.engine.core.clock import now_ns
from opscope.engine.core.devices import resolve_device, resolve_dtype
from opscope.engine.core.errors import ConfigError
from opscope.engine.generation.generate import GenerationConfig, generate

if TYPE_CHECKING:
    from pathlib import Path

    import torch
    from opscope.engine.formats.gguf_source import GGUFSource
    from opscope.engine.formats.hf_source import HFDirSource
    from opscope.engine.models.transformer import Transformer

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
    cpu_kernels: str | None = None  # the CPU kernel variant the fast path runs (None: the plain path)


class LoadedModel:
    """A model on a device with its tokenizer; every generation path yields engine.events."""

    backend_name = "torch"

    def __init__(
        self, source: GGUFSource | HFDirSource, model: Transformer, options: LoadOptions, load_ms: float
    ) -> None:
        self.source, self.model, self.options, self.load_ms = source, model, options, load_ms
        self.tokenizer = source.tokenizer
        self.config = source.config
        self.device = model.embed.weight.device
        self.dtype = model.embed.weight.dtype

    def generate(
        self,
        prompt: str | list[int],
        config: GenerationConfig = GenerationConfig(),
        cancel: threading.Event | None = None,
    ) -> Iterator:
        request_ns = now_ns()
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        self._check_ids(ids)
        return generate(self.model, self.tokenizer, ids, config, cancel, request_ns)

    def chat(
        self, messages: list[dict], config: GenerationConfig = GenerationConfig(), cancel: threading.Event | None = None
    ) -> Iterator:
        request_ns = now_ns()
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if config.reuse_prefix:  # the previous reply as generated, not as re-tokenized
            from opscope.engine.generation import prefix_cache

            ids = prefix_cache.aligned_ids(self.model, self.tokenizer, text, ids)
        return generate(self.model, self.tokenizer, ids, config, cancel, request_ns)

    def generate_batch(
        self,
        prompts: list[str | list[int]],
        config: GenerationConfig = GenerationConfig(),
        cancel: threading.Event | None = None,
    ) -> Iterator:
        from opscope.engine.generation.batch import generate_batch

        ids = [self.tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompts]
        for one in ids:
            self._check_ids(one)
        from opscope.engine.generation import prefix_cache

        prefix_cache.forget(self.model)  # the batch overwrites row 0 of the cache
        return generate_batch(self.model, self.tokenizer, ids, config, cancel)

    def logits(self, ids: list[int]) -> torch.Tensor:
        """Float32 logits [T, V] of a full forward pass without the cache (reference tests)."""
        import torch

        self._check_ids(ids)
        from opscope.engine.generation import prefix_cache

        prefix_cache.forget(self.model)  # a reference pass leaves nothing to reuse
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
        stats = {"weights_bytes": weights, "kv_cache_bytes": kv, "rss_bytes": psutil.Process().memory_info().rss}
        if self.device.type == "cuda":
            stats |= {
                "cuda_allocated_bytes": torch.cuda.memory_allocated(self.device),
                "cuda_reserved_bytes": torch.cuda.memory_reserved(self.device),
                "cuda_peak_bytes": torch.cuda.max_memory_allocated(self.device),
            }
        return stats

    def describe(self) -> dict:
        return {
            "model": str(self.source.path),
            "format": self.source.format,
            "arch": self.config.arch,
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            "attention": self.options.attention,
            "threads": _threads(),
            "backend": self.backend_name,
            "fastpath": self.options.fastpath,
            "cpu_kernels": self.options.cpu_kernels,
        }


def _threads() -> int:
    import torch

    return int(torch.get_num_threads())


def _unique_tensors(model: torch.nn.Module) -> Iterator[torch.Tensor]:
    """Parameters and buffers (the fast path keeps packed weights as buffers), each once; the KV
    cache is counted separately."""
    seen = set()
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if id(t) not in seen and ".cache." not in name and not name.startswith("inv_freq"):
            seen.add(id(t))
            yield t


def load_plain(
    model: str | Path | None = None,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    attention: str = "sdpa",
    threads: int | None = None,
    compile: str = "off",
    quantize: str = "off",
) -> LoadedModel:
    """The plain torch model of ``model`` (engine.models) on ``device``; ``compile`` and
    ``quantize`` as in engine.api.load, whose checks of them have run."""
    import torch
    from opscope.engine.formats import open_model
    from opscope.engine.models.compiled import enable_compiled_decode
    from opscope.engine.models.loader import build_model
    from opscope.engine.models.transformer import ATTENTION_IMPLS
    from opscope.engine.models.woq import quantize_weights

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
        log.warning(
            "--quantize %s is the GPU path; on the CPU the default fast path is faster "
            "(it keeps the GGUF's own blocks)",
            quantize,
        )
    if dev.type == "cpu":
        net.decode_threads = 1  # see engine.generate.decode_threads
    if compile == "decode":
        enable_compiled_decode(net)
    elif dev.type == "cuda":  # a compiled step would compile here, minutes of load for one warm-up
        from opscope.engine.generation.generate import warm_up

        warm_up(net)
    load_ms = (now_ns() - t0) / 1e6
    log.info("loaded %s on %s/%s in %.0f ms", source.path, dev, dt, load_ms)
    options = LoadOptions(device, dtype, attention, threads, compile=compile, quantize=quantize)
    return LoadedModel(source, net, options, load_ms)


os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
