"""Load a model source into MLX, and the loaded model's generate/chat/memory API."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import mlx.core as mx
from opscope.engine import ConfigError, DeviceError, GenerationConfig, markers, now_ns
from opscope.plugins.mlx_backend.generate import generate
from opscope.plugins.mlx_backend.model import MLXModelArgs, Transformer
from opscope.plugins.mlx_backend.weights import apply_weights, mlx_dtype, read_gguf, read_hf, weights_nbytes

log = logging.getLogger(__name__)

DEVICES = {"cpu": "cpu", "gpu": "gpu"}


def resolve_device(name: str):
    """'cpu' or 'gpu' (Metal on Apple Silicon, CUDA with mlx[cuda]) -> mx.Device."""
    key = str(name).lower()
    if key not in DEVICES:
        raise DeviceError(f"--device {name!r} is not an mlx device; use cpu or gpu")
    dev = mx.cpu if key == "cpu" else mx.gpu
    if not mx.is_available(dev):
        raise DeviceError(
            f"--device {name}: this mlx build ({mx.__version__}) has no GPU backend here; use --device cpu"
        )
    return mx.Device(dev)


class MLXLoadedModel:
    """A model in MLX with the engine's tokenizer; yields engine.events like engine.api.LoadedModel."""

    backend_name = "mlx"

    def __init__(self, source, model: Transformer, device: str, dtype: str, load_ms: float):
        self.source, self.model, self.load_ms = source, model, load_ms
        self.tokenizer = source.tokenizer
        self.config = source.config
        self.device, self.dtype = device, dtype
        self.mx_device = resolve_device(device)
        self.last_caches: list = []

    def generate(
        self,
        prompt: str | list[int],
        config: GenerationConfig = GenerationConfig(),
        cancel: threading.Event | None = None,
    ) -> Iterator:
        request_ns = now_ns()
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        self._check_ids(ids)
        return generate(self, ids, config, cancel, request_ns)

    def chat(
        self, messages: list[dict], config: GenerationConfig = GenerationConfig(), cancel: threading.Event | None = None
    ) -> Iterator:
        request_ns = now_ns()
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return generate(self, ids, config, cancel, request_ns)

    def logits(self, ids: list[int]):
        """Float32 logits [T, V] (numpy) of one forward pass over ``ids`` (reference tests)."""
        import numpy as np

        self._check_ids(ids)
        with mx.stream(self.mx_device):
            out = self.model(mx.array([ids], dtype=mx.int32), self.model.new_caches())[0]
            return np.array(out.astype(mx.float32))

    def _check_ids(self, ids: list[int]) -> None:
        bad = [i for i in ids if not 0 <= i < self.config.vocab_size]
        if bad:
            raise ConfigError(f"token id {bad[0]} is outside the vocabulary (0..{self.config.vocab_size - 1})")

    def memory_stats(self) -> dict:
        import psutil

        return {
            "weights_bytes": weights_nbytes(self.model),
            "kv_cache_bytes": sum(c.nbytes for c in self.last_caches),
            "active_bytes": mx.get_active_memory(),
            "peak_bytes": mx.get_peak_memory(),
            "cache_bytes": mx.get_cache_memory(),
            "rss_bytes": psutil.Process().memory_info().rss,
        }

    def describe(self) -> dict:
        out = {
            "model": str(self.source.path),
            "format": self.source.format,
            "arch": self.config.arch,
            "device": self.device,
            "dtype": self.dtype,
            "attention": "sdpa",
            "backend": "mlx",
            "mlx_version": mx.__version__,
        }
        lines = conversions(self.source)
        if lines:
            out["conversion"] = "; ".join(lines)
        return out


def conversions(source) -> list[str]:
    """How the file's quantized types reach MLX ('Q4_K → MLX 4-bit g32: requantized'); [] for
    safetensors (float, or already MLX-quantized)."""
    from opscope.plugins.mlx_backend.convert import summary

    return summary(source.quant_summary) if source.format == "gguf" else []


def load(
    path, device: str = "cpu", dtype: str = "float32", threads: int | None = None, attention: str = "sdpa"
) -> MLXLoadedModel:
    """Read ``path`` (None: the embedded default model) into MLX on ``device``."""
    from opscope.engine import open_model

    if attention != "sdpa":
        raise ConfigError(
            f"--attention {attention!r}: the mlx backend has only 'sdpa' (mx.fast.scaled_dot_product_attention)"
        )
    if threads is not None:
        log.warning("mlx sets its own CPU threads; --threads %s is ignored", threads)
    dev, dt = resolve_device(device), mlx_dtype(dtype)
    t0 = now_ns()
    with markers.phase(markers.MODEL_LOAD, model=str(path or "default"), backend="mlx"):
        source = open_model(path)  # validates the header before mlx's reader sees the file
        model = _build(source, dev, dt)
    load_ms = (now_ns() - t0) / 1e6
    log.info(
        "mlx loaded %s on %s/%s in %.0f ms%s",
        source.path,
        device,
        dtype,
        load_ms,
        "".join(f"; {line}" for line in conversions(source)),
    )
    return MLXLoadedModel(source, model, str(device).lower(), dtype, load_ms)


def _build(source, dev, dt) -> Transformer:
    tensors = read_gguf(source) if source.format == "gguf" else read_hf(source)
    factors = tensors.pop("rope_freqs", None)
    args = MLXModelArgs.from_config(
        source.config,
        rope_traditional=False,  # both readers give Q/K rows in rotate-half order
        tie_embeddings="lm_head.weight" not in tensors,
        rope_freq_factors=None if factors is None else tuple(factors.astype(mx.float32).tolist()),
    )
    with mx.stream(dev):
        model = Transformer(args)
        apply_weights(model, tensors, dt)
        mx.eval(model.parameters())
    return model
