"""MLX generation: a Stepper for engine.backends.loop, which yields the engine's event stream.

MLX is lazy: nothing runs until a value is needed. Prompt chunks are evaluated in ``forward`` so
prefill progress timestamps mark finished work; a decode step's forward pass stays lazy and is
evaluated together with the sampler in ``sample`` (one graph, one host wait per token).
The device's stream is entered around each computation, never across a yield, so the caller's
own MLX work between events keeps its default device.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import mlx.core as mx
from opscope.engine import check_prompt, stream_generation
from opscope.plugins.mlx_backend.sampling import Sampler


class MLXStepper:
    def __init__(self, lm, cfg, prompt_ids: list[int]):
        self.lm, self.device = lm, lm.mx_device
        self.caches = lm.model.new_caches()
        self.sampler = Sampler(cfg, prompt_ids)
        self.logits: mx.array | None = None  # [1, V] of the last position seen

    def forward(self, ids: list[int]) -> None:
        with mx.stream(self.device):
            x = mx.array([ids], dtype=mx.int32)  # [1, T]
            self.logits = self.lm.model(x, self.caches, last_only=True)[:, -1, :]
            if len(ids) > 1:
                mx.eval(self.logits)

    def sample(self) -> int:
        with mx.stream(self.device):
            token_id = self.sampler(self.logits).item()
        self.sampler.accept(token_id)
        return token_id


def generate(lm, prompt_ids: list[int], cfg, cancel: threading.Event | None, request_ns: int) -> Iterator:
    """Checks the request at once (not on first iteration), then streams engine.events."""
    check_prompt(prompt_ids, cfg, lm.config.max_seq_len)
    stepper = MLXStepper(lm, cfg, prompt_ids)
    lm.last_caches = stepper.caches  # memory_stats reports the KV cache of the latest request
    return stream_generation(stepper, lm.tokenizer, prompt_ids, cfg, cancel, request_ns, lm.config.max_seq_len)
