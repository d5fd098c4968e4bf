"""opscope-example-backend: the smallest complete OpScope backend plugin.

The ``echo`` backend reads the model's tokenizer and "generates" by repeating the prompt's tokens.
To write a real backend, keep EchoBackend's shape and replace EchoStepper: ``forward(ids)`` runs
your model over new tokens, ``sample()`` returns the next token id. The engine's loop
(engine.backends.loop.stream_generation) turns that into the standard event stream.

Import only engine's public API here, and import heavy frameworks inside methods: this module is
imported the first time a user asks for the backend, and ``is_available()`` must be able to say
"not installed" instead of failing.
"""

from __future__ import annotations

import threading
from pathlib import Path

from opscope.engine import API_VERSION, ConfigError, DeviceError, DeviceInfo, now_ns

__version__ = "0.1.0"


class EchoBackend:
    """Backend plugin ``echo`` (the contract: engine.backends.Backend)."""

    name = "echo"
    api_version = API_VERSION  # the registry refuses the plugin if the engine's version differs

    def is_available(self) -> tuple[bool, str]:
        return True, ""  # a real backend checks its framework here, e.g. importlib.util.find_spec

    def devices(self) -> list[DeviceInfo]:
        return [DeviceInfo("cpu", "cpu", True, description="pure Python")]

    def load(
        self, source: str | Path | None = None, device: str = "cpu", dtype: str = "float32", **options
    ) -> EchoModel:
        from opscope.engine import open_model  # reads and validates GGUF or HF directories

        if options:
            raise ConfigError(f"echo backend: unknown option(s) {', '.join(sorted(options))}")
        if device != "cpu":
            raise DeviceError(f"--device {device!r}: the echo backend runs on cpu only")
        if dtype != "float32":
            raise ConfigError(f"--dtype {dtype!r}: the echo backend has float32 only")
        return EchoModel(open_model(source))


class EchoStepper:
    """One request's state. A real backend keeps its KV cache and last logits here."""

    def __init__(self, prompt_ids: list[int]):
        self.prompt_ids = prompt_ids
        self.generated = 0

    def forward(self, ids: list[int]) -> None:
        pass  # a real backend runs its model over ``ids`` here (and finishes before returning)

    def sample(self) -> int:
        token_id = self.prompt_ids[self.generated % len(self.prompt_ids)]
        self.generated += 1
        return token_id


class EchoModel:
    """What ``load`` returns: generate / chat yield engine.events; memory_stats reports bytes."""

    def __init__(self, source):
        self.source = source
        self.tokenizer = source.tokenizer
        self.config = source.config
        self.device, self.dtype = "cpu", "float32"

    def generate(self, prompt: str | list[int], config=None, cancel: threading.Event | None = None):
        request_ns = now_ns()
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        return self._stream(ids, config, cancel, request_ns)

    def chat(self, messages: list[dict], config=None, cancel: threading.Event | None = None):
        request_ns = now_ns()
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return self._stream(ids, config, cancel, request_ns)

    def _stream(self, ids: list[int], config, cancel, request_ns: int):
        from opscope.engine import GenerationConfig, check_prompt, stream_generation

        config = config or GenerationConfig()
        bad = [i for i in ids if not 0 <= i < self.config.vocab_size]
        if bad:
            raise ConfigError(f"token id {bad[0]} is outside the vocabulary (0..{self.config.vocab_size - 1})")
        check_prompt(ids, config, self.config.max_seq_len)  # errors now, not on first iteration
        return stream_generation(
            EchoStepper(ids), self.tokenizer, ids, config, cancel, request_ns, self.config.max_seq_len
        )

    def memory_stats(self) -> dict[str, int]:
        import resource

        # ru_maxrss is in KiB on Linux (bytes on macOS; close enough for an example)
        return {"weights_bytes": 0, "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
