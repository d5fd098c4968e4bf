"""The Backend API: what a backend plugin provides, and what the engine promises in return.

A backend turns a model source (a GGUF file or a Hugging Face safetensors directory) into a loaded
model on one of its devices; the loaded model generates the typed events of ``engine.events``
(PrefillStarted → PrefillProgress* → PrefillFinished → Token* → Finished), so the CLI, the GUI and
the benchmarks work with every backend unchanged.

Versioning: ``API_VERSION`` is one integer, raised on every incompatible change to the protocols
below. A plugin declares the version it was written against in its ``api_version`` attribute; the
registry refuses a plugin whose version differs, with a message saying which versions are involved
and what to upgrade. Optional members (``trace_ops``, ``bench_matmul``, ``bench_copy``) may be
added without raising the version: callers probe for them with :func:`capabilities`.

Plugins import only engine's public API: ``engine.backends``, ``engine.events``, ``engine.errors``,
``engine.generation_config.GenerationConfig``, ``engine.formats``, ``engine.tokenizer``, ``engine.api``,
``engine.clock`` and ``engine.markers``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

API_VERSION = 1

# Optional members a backend may implement; see Backend's docstring for their contracts.
OPTIONAL_MEMBERS = ("trace_ops", "bench_matmul", "bench_copy", "conversion")


@dataclass(frozen=True)
class DeviceInfo:
    """One device a backend can run on, available or not.

    ``name`` is what users pass as ``--device`` (``"cpu"``, ``"cuda:0"``, ``"gpu"``). ``kind`` is the
    hardware family: ``"cpu"``, ``"cuda"``, ``"rocm"`` (an AMD GPU; ROCm builds of torch still
    name it ``cuda:N``), ``"mps"``, ``"metal"``, ``"gpu"`` or ``"other"``. An unavailable device
    carries the ``reason`` (``"torch 2.13.0+cpu is a CPU-only build"``), so users see why.
    """

    name: str
    kind: str
    available: bool
    reason: str = ""
    description: str = ""  # e.g. the GPU's marketing name
    memory_bytes: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "available": self.available,
            "reason": self.reason,
            "description": self.description,
            "memory_bytes": self.memory_bytes,
        }


@dataclass(frozen=True)
class OpEvent:
    """One operation seen by a backend's ``trace_ops`` hook.

    ``t_ns`` is on the engine clock (``engine.clock.now_ns``) when the op was issued; for lazy
    frameworks (MLX) that is graph-construction time, not execution time. ``device`` names where
    the op runs (``"cpu"``, ``"cuda:0"``, ``"gpu"``, or an MLX stream such as ``"Stream(gpu, 0)"``).
    """

    seq: int
    op: str
    device: str
    input_shapes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    output_shapes: tuple[tuple[int, ...], ...]
    output_dtypes: tuple[str, ...]
    t_ns: int
    attrs: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class LoadedModelLike(Protocol):
    """A model a backend has loaded onto a device.

    ``engine.api.LoadedModel`` (the built-in torch engine) is the reference implementation; every
    backend's loaded model behaves the same way:

    * ``generate(prompt, config=None, cancel=None)`` takes a string (tokenized with the model's own
      tokenizer, special tokens added as the model asks) or a list of token ids, and a
      ``engine.generation_config.GenerationConfig`` (``None`` means its defaults). It returns an iterator of
      ``engine.events`` in the order PrefillStarted, PrefillProgress*, PrefillFinished, Token*,
      Finished, every ``t_ns`` from ``engine.clock.now_ns`` and non-decreasing. It honours
      ``max_tokens``, ``stop`` strings (the stop string is not part of ``Finished.text``),
      ``ignore_eos``, greedy decoding at ``temperature == 0`` and the sampling options, and
      ``cancel`` (a ``threading.Event``): once set, the iterator ends with
      ``Finished(stop_reason="cancelled")`` after at most one more token.
      ``Finished.stop_reason`` is ``"eos"``, ``"stop_string"``, ``"length"`` or ``"cancelled"``.
    * ``chat(messages, config=None, cancel=None)`` renders ``[{"role", "content"}, ...]`` with the
      model's chat template and generates as above.
    * ``memory_stats()`` returns byte counts with ``*_bytes`` keys; at least ``weights_bytes``
      (what the loaded weights occupy on the device) and, where the framework reports them,
      ``active_bytes``, ``peak_bytes`` and ``cache_bytes``.
    * ``tokenizer`` has ``encode(text, add_special_tokens=True)``, ``decode(ids)``, ``eos_ids``.
    * ``device`` and ``dtype`` say where and in which precision the model runs.

    Errors are ``engine.errors.EngineError`` subclasses: a bad request (empty prompt, prompt longer
    than the context) is a ``ConfigError``.
    """

    tokenizer: Any

    def generate(
        self, prompt: str | list[int], config: Any = None, cancel: threading.Event | None = None
    ) -> Iterator[Any]: ...

    def chat(
        self, messages: list[dict[str, str]], config: Any = None, cancel: threading.Event | None = None
    ) -> Iterator[Any]: ...

    def memory_stats(self) -> dict[str, int]: ...


@runtime_checkable
class Backend(Protocol):
    """What a backend plugin exposes through the ``opscope.backends`` entry-point group.

    The entry point names a class (instantiated with no arguments on first use) or an instance.
    Its module must be cheap to import: import the framework (torch, mlx, onnxruntime) inside the
    methods, so that a missing framework makes ``is_available()`` say so instead of breaking the
    import.

    Required members:

    * ``name``: the backend's name, equal to its entry-point name (``"torch"``, ``"mlx"``).
    * ``api_version``: the ``API_VERSION`` this plugin was written against.
    * ``is_available() -> (bool, reason)``: whether the backend can run here at all; ``reason``
      says why not and how to fix it (``"mlx is not installed: pip install 'mlx[cpu]'"``).
      Never raises.
    * ``devices() -> list[DeviceInfo]``: every device the backend knows of, with the unavailable
      ones marked and explained. Never raises.
    * ``load(source, device="cpu", dtype="float32", **options) -> LoadedModelLike``: loads a model.
      ``source`` is a path to a GGUF file or a Hugging Face model directory, or ``None`` for the
      embedded default model (``engine.defaults.default_model_path()``). ``options`` carry
      backend-specific settings (``threads``, ``attention``); unknown options raise
      ``ConfigError``. A missing or corrupt file raises ``ModelFormatError``, an unknown or
      unusable device ``DeviceError``, an unsupported dtype ``ConfigError``, an unsupported
      architecture or quantization ``UnsupportedModelError``.

    Optional members (probe with :func:`capabilities`):

    * ``trace_ops(sink: Callable[[OpEvent], None]) -> ContextManager``: while the context is open,
      every op the backend issues in this process is reported to ``sink`` as an :class:`OpEvent`.
    * ``bench_matmul(m, n, k, *, device, dtype, iterations) -> list[int]``: the wall time in ns of
      ``iterations`` (m×k)@(k×n) products, each timed with the device synchronized before every
      clock read; one warm-up product runs first and is not counted.
    * ``bench_copy(n_bytes, *, device, iterations) -> list[int]``: the same for a device-to-device
      copy of ``n_bytes`` (bytes moved per copy = 2 × n_bytes: one read, one write).
    * ``conversion(types: dict[str, int]) -> list[str]``: how the backend takes a GGUF's tensor types
      (``{"Q4_K": 16, ...}``) at load, one line per converted type ("Q4_K → MLX 4-bit g32: exact");
      shown by ``opscope models inspect --backend NAME``.
    """

    name: str
    api_version: int

    def is_available(self) -> tuple[bool, str]: ...

    def devices(self) -> list[DeviceInfo]: ...

    def load(
        self, source: str | Path | None, device: str = "cpu", dtype: str = "float32", **options: Any
    ) -> LoadedModelLike: ...


REQUIRED_MEMBERS = ("name", "api_version", "is_available", "devices", "load")


def capabilities(backend: object) -> frozenset[str]:
    """The optional members ``backend`` implements (a subset of ``OPTIONAL_MEMBERS``)."""
    return frozenset(m for m in OPTIONAL_MEMBERS if callable(getattr(backend, m, None)))


def missing_members(backend: object) -> list[str]:
    """Required members ``backend`` lacks; empty for a complete backend."""
    return [m for m in REQUIRED_MEMBERS if not hasattr(backend, m)]
