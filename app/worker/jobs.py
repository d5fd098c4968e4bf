"""What the engine worker does for each request, against the engine's public API only.

Runs inside the worker process (no Qt). Every long job streams its progress through ``send`` and
honours the cancel flag; the return value is the payload of the terminal ``result`` message.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from opscope.app.worker.protocol import (
    BenchRequest,
    ChatRequest,
    GenerateRequest,
    LoadRequest,
    TraceRequest,
    event_to_dict,
)

log = logging.getLogger(__name__)

Send = Callable[..., None]


class EngineState:
    """The worker's one loaded model and the handlers that use it."""

    def __init__(self, send: Send) -> None:
        self.send = send
        self.loaded: Any = None
        self.load_spec: LoadRequest | None = None
        self.info: dict | None = None  # model_info() of what is loaded now; None = nothing
        self._unsubscribe = _forward_markers(send)

    def handle(self, req, cancel: threading.Event) -> dict:
        handlers = {
            "load": self.load,
            "generate": self.generate,
            "chat": self.chat,
            "trace": self.trace,
            "diagnose": self.diagnose,
            "bench": self.bench,
            "roofline": lambda req, _cancel: stored_roofline(req.run_id, req.db_url),
            "info": lambda _req, _cancel: engine_info(),
        }
        return handlers[req.type](req, cancel)

    def require_model(self):
        if self.loaded is None:
            from opscope.engine import ConfigError

            raise ConfigError("no model is loaded in the engine: pick a model in the toolbar first")
        return self.loaded

    def load(self, req: LoadRequest, cancel: threading.Event) -> dict:
        if self.loaded is not None and req == self.load_spec:
            return model_info(self.loaded, req, load_ms=0.0, reused=True)
        previous = self.load_spec if self.loaded is not None else None
        # Drop the old weights before loading new ones (peak memory stays one model); a failed load
        # brings the old model back, with the conversation's KV cache (a host copy of its held
        # positions), so a bad file neither leaves the user with nothing loaded nor re-reads the chat.
        kept = _cache_snapshot(self.loaded)
        self.loaded, self.load_spec, self.info = None, None, None
        gc.collect()
        t0 = time.perf_counter()
        try:
            with kernel_build_heartbeat(self.send):
                loaded = _load_model(req)
        except BaseException:
            if previous is not None:
                self._restore(previous, kept)
            raise
        self.loaded, self.load_spec = loaded, req
        self.info = model_info(loaded, req, load_ms=(time.perf_counter() - t0) * 1e3, reused=False)
        return self.info

    def _restore(self, spec: LoadRequest, kept=None) -> None:
        """Reload ``spec`` after a failed load, with ``kept`` (a prefix-cache snapshot) put back; on
        failure nothing stays loaded (``info`` says so)."""
        t0 = time.perf_counter()
        try:
            self.loaded = _load_model(spec)
        except Exception:
            log.exception("could not reload %s after a failed load", spec.model or "the default model")
            return
        if kept is not None:
            from opscope.engine import prefix_cache

            prefix_cache.restore(self.loaded.model, kept)
        self.load_spec = spec
        self.info = model_info(self.loaded, spec, load_ms=(time.perf_counter() - t0) * 1e3, reused=False)

    def generate(self, req: GenerateRequest, cancel: threading.Event) -> dict:
        events = self.require_model().generate(req.prompt, generation_config(req.config), cancel)
        return self._stream(events)

    def chat(self, req: ChatRequest, cancel: threading.Event) -> dict:
        loaded, config = self.require_model(), generation_config(req.config)
        messages = fit_context(loaded, list(req.messages), req.context_length, config.max_tokens)
        return self._stream(loaded.chat(messages, config, cancel))

    def _stream(self, events) -> dict:
        finished = None
        try:
            for event in events:
                data = event_to_dict(event)
                self.send("event", event=data)
                if data["kind"] == "Finished":
                    finished = data
        finally:  # never left suspended: see engine/cli/commands/generate.py's _stream
            getattr(events, "close", lambda: None)()
        if finished is None:
            return {"stop_reason": "none", "stats": None, "text": ""}
        return {"stop_reason": finished["stop_reason"], "stats": finished["stats"], "text": finished["text"]}

    def trace(self, req: TraceRequest, cancel: threading.Event) -> dict:
        from opscope.app.worker.trace import run_trace

        return run_trace(self.require_model(), req, self.send, cancel)

    def diagnose(self, req, cancel: threading.Event) -> dict:
        from opscope.app.worker.diagnose import run_diagnose

        return run_diagnose(self.require_model(), req, self.send, cancel)

    def bench(self, req: BenchRequest, cancel: threading.Event) -> dict:
        from opscope.app.worker.bench import run_bench

        return run_bench(self.loaded, self.load_spec, req, self.send, cancel)

    def report_memory(self) -> None:
        stats: dict[str, Any] = {"rss_bytes": _rss_bytes()}
        if self.loaded is not None:
            try:
                stats.update(self.loaded.memory_stats())
            except Exception:  # memory stats are a nicety; never fail a job over them
                log.warning("memory_stats() failed", exc_info=True)
        self.send("memory", stats=stats)


def stored_roofline(run_id: int, db_url: str | None) -> dict:
    """A stored run's roofline as ``roofline.as_dict`` (None for a kind a roofline cannot place),
    with the run's id, name and kind (as ``run_kind``: a reply's ``kind`` is its message type). Runs
    here, not in the GUI process: it reads the store and imports torch."""
    from opscope.engine import RunStore, roofline

    with RunStore.open(db_url) as store:
        stored = store.load(run_id)
        # the memory roof from a stored bandwidth run, else a short probe (engine roofline.from_run)
        roof = roofline.from_run(stored.result, store, probe=True) if stored.info.kind in roofline.SUITES else None
    return {
        "run_id": run_id,
        "name": stored.info.name,
        "run_kind": stored.info.kind,
        "roofline": roof.as_dict() if roof is not None else None,
    }


def engine_info() -> dict:
    """Backends and their devices (with reasons), dtypes, suites and trace variants."""
    from opscope.engine import DTYPES

    return {
        "backends": _backends(),
        "dtypes": list(DTYPES),
        "suites": _suites(),
        "trace_variants": _trace_variants(),
        "load_options": load_options(),
    }


def load_options() -> dict:
    """What each model option of a load may take (the settings dialog is built from this)."""
    from opscope.engine import COMPILE_MODES, WOQ_MODES
    from opscope.engine import fastpath_settings as fp

    choices = {
        "weights": fp.WEIGHTS,
        "activations": fp.ACTIVATIONS,
        "prefill_dtype": (fp.PREFILL_AUTO, *fp.PREFILL_DTYPES),
        "on_error": fp.ON_ERROR,
    }
    default = fp.FastPathOptions()
    fields = []
    for f in dataclasses.fields(fp.FastPathOptions):
        value = fp.PREFILL_AUTO if f.name == "prefill_dtype" else getattr(default, f.name)  # the engine's choice
        kind = "choice" if f.name in choices else "bool" if isinstance(value, bool) else "int"
        fields.append(
            {
                "name": f.name,
                "type": kind,
                "default": value,
                **({"choices": list(choices[f.name])} if kind == "choice" else {}),
            }
        )
    return {
        "attention": ["sdpa", "naive"],
        "compile": list(COMPILE_MODES),
        "quantize": list(WOQ_MODES),
        "fastpath_fields": fields,
    }


def fit_context(loaded, messages: list[dict], context_length: int, max_tokens: int) -> list[dict]:
    """The newest messages whose chat prompt plus ``max_tokens`` fit in ``context_length`` tokens (0 =
    the model's own limit); system messages always stay. Too long even alone: a ConfigError."""
    from opscope.engine import ConfigError

    limit = getattr(getattr(loaded, "config", None), "max_seq_len", 0) or 0
    if context_length:
        limit = min(limit, context_length) if limit else context_length
    if not limit or getattr(loaded, "tokenizer", None) is None:
        return messages

    def prompt_tokens(msgs: list[dict]) -> int:
        text = loaded.tokenizer.apply_chat_template(msgs, add_generation_prompt=True)
        return len(loaded.tokenizer.encode(text, add_special_tokens=False))

    kept = list(messages)
    while prompt_tokens(kept) + max_tokens > limit:
        oldest = next((i for i, m in enumerate(kept[:-1]) if m.get("role") != "system"), None)
        if oldest is None:
            raise ConfigError(
                f"the last message ({prompt_tokens(kept)} prompt tokens) and max tokens "
                f"({max_tokens}) do not fit the context length of {limit} tokens; shorten the "
                f"message, lower max tokens or raise the context length in Engine → Settings"
            )
        del kept[oldest]
    if len(kept) < len(messages):
        log.info("chat: dropped the %d oldest message(s) to fit %d tokens", len(messages) - len(kept), limit)
    return kept


def _backends() -> list[dict]:
    from opscope.engine import list_backends

    infos = [info.as_dict() for info in list_backends(load=True)]
    torch_info = next((i for i in infos if i["name"] == "torch"), None)
    if torch_info is None or torch_info["status"] != "ok":
        # The built-in engine serves "torch" even when its plugin entry is missing or broken.
        from opscope.engine import available_devices

        devices = [
            {"name": n, "kind": n.split(":")[0], "available": ok, "reason": why} for n, ok, why in available_devices()
        ]
        infos = [i for i in infos if i["name"] != "torch"]
        infos.insert(0, {"name": "torch", "status": "ok", "reason": "", "devices": devices})
    return infos


def _suites() -> list[dict]:
    from opscope.app.worker.bench import suite_catalog

    return suite_catalog()


def _trace_variants() -> list[str]:
    from opscope.engine import TRACE_VARIANTS as VARIANTS

    return list(VARIANTS)


def generation_config(values: dict):
    """A dict from the GUI → engine.generate.GenerationConfig; unknown keys are a ConfigError."""
    from opscope.engine import ConfigError, GenerationConfig

    known = {f.name for f in dataclasses.fields(GenerationConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(f"unknown sampling setting(s) {unknown}; known: {sorted(known)}")
    values = dict(values)
    if "stop" in values:
        values["stop"] = tuple(values["stop"] or ())
    return GenerationConfig(**values)


KERNEL_HEARTBEAT_S = 10.0
KERNEL_BUILD_LIMIT_S = 3600.0


@contextlib.contextmanager
def kernel_build_heartbeat(send: Send, every_s: float = KERNEL_HEARTBEAT_S):
    """While a load waits for the CPU kernels to compile (the first start after an install or an
    update: minutes on a busy machine), say so every ``every_s``: the GUI's no-sign-of-life
    watchdog (300 s for a load) must not kill a worker that is compiling, not hung, and lose the
    build. Only while the compiled library is missing, and for at most KERNEL_BUILD_LIMIT_S."""
    try:
        from opscope.engine import kernel_build_key as build_key
        from opscope.engine import kernel_cache_root as cache_root

        name = f"opscope_qlinear_{build_key()}"
        folder = cache_root() / name
    except Exception:
        log.debug("no kernel build to watch", exc_info=True)
        yield
        return

    def missing() -> bool:
        return not any(folder.glob(f"{name}*.so"))

    if not missing():
        yield
        return
    done, start = threading.Event(), time.monotonic()

    def beat() -> None:
        while not done.wait(every_s) and missing() and time.monotonic() - start < KERNEL_BUILD_LIMIT_S:
            send("progress", stage="building the CPU kernels", elapsed_s=round(time.monotonic() - start))

    thread = threading.Thread(target=beat, daemon=True, name="opscope-kernel-heartbeat")
    thread.start()
    try:
        yield
    finally:
        done.set()
        # a beat already past its wait would otherwise land after the load's own last message
        thread.join(timeout=5.0)


def _cache_snapshot(loaded):
    """What the built-in engine's KV cache holds, copied to the host (None for other backends)."""
    model = getattr(loaded, "model", None)
    if model is None or not hasattr(model, "layers"):
        return None
    from opscope.engine import prefix_cache

    return prefix_cache.snapshot(model)


def _load_model(req: LoadRequest):
    options: dict[str, Any] = {"attention": req.attention}
    if req.threads:
        options["threads"] = req.threads
    if req.backend == "torch":
        # The built-in engine *is* the torch backend (its plugin is a thin wrapper over it): no
        # registry round-trip, so the app works even when plugin discovery is broken.
        from opscope.engine import load

        return load(
            req.model,
            device=req.device,
            dtype=req.dtype,
            fastpath=req.fastpath,
            compile=req.compile,
            quantize=req.quantize,
            **options,
        )
    from opscope.engine import get_backend

    # Other backends get the torch-only options only when set, so a plugin without them still loads.
    extra = {
        k: v
        for k, v in (("fastpath", req.fastpath), ("compile", req.compile), ("quantize", req.quantize))
        if v not in ("auto", "off")
    }
    return get_backend(req.backend).load(req.model, req.device, req.dtype, **options, **extra)


def model_info(loaded, req: LoadRequest, *, load_ms: float, reused: bool) -> dict:
    source = getattr(loaded, "source", None)
    config = getattr(source, "config", None)
    return {
        "path": str(getattr(source, "path", req.model or "")),
        "format": getattr(source, "format", ""),
        "quant_summary": _jsonable(getattr(source, "quant_summary", "")),
        "file_size_bytes": getattr(source, "file_size_bytes", None),
        "config": dataclasses.asdict(config) if dataclasses.is_dataclass(config) else {},
        "has_chat_template": bool(getattr(source, "chat_template", None)),
        "device": str(getattr(loaded, "device", req.device)),
        "dtype": str(getattr(loaded, "dtype", req.dtype)).replace("torch.", ""),
        "fastpath": str(getattr(getattr(loaded, "options", None), "fastpath", "off")),
        "cpu_kernels": _cpu_kernels(loaded),
        "backend": req.backend,
        "conversion": _conversion(loaded),
        "load_ms": load_ms,
        "reused": reused,
    }


def _conversion(loaded) -> str:
    """How a backend converted the file's tensor types at load (MLX: 'Q4_K → MLX 4-bit g32: exact'), or ''."""
    describe = getattr(loaded, "describe", None)
    return str(describe().get("conversion", "")) if callable(describe) else ""


def _jsonable(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool, type(None), list, dict)):
        return value
    return str(value)


def _forward_markers(send: Send) -> Callable[[], None]:
    from opscope.engine import markers

    def forward(marker) -> None:
        send("marker", phase=marker.phase, edge=marker.edge, t_ns=marker.t_ns, attrs=dict(marker.attrs))

    return markers.subscribe(forward)


def _rss_bytes() -> int | None:
    try:
        import psutil

        return psutil.Process(os.getpid()).memory_info().rss
    except Exception:
        return None


def _cpu_kernels(loaded) -> str | None:
    """The fast path's kernel variant (e.g. "avx2"), None on the plain path or another backend."""
    from opscope.engine import cpu_kernels

    return cpu_kernels(str(getattr(getattr(loaded, "options", None), "fastpath", "off")))
