"""The engine settings the window offers (every `opscope generate` model option), Qt-free.

``EngineSettings`` is what the settings dialog edits and app.settings persists; ``load_fields``
turns it into LoadRequest fields. What each setting may take comes from the engine worker
(``engine_info()["load_options"]``) so the GUI never imports torch; ``FALLBACK_LOAD_OPTIONS`` is the
same answer for the moment before the worker has replied (a test keeps the two equal).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace

FASTPATH_MODES = ("auto", "on", "off")
FASTPATH_ON_DEFAULT = "weights=q"  # "on" with every fast-path setting at its default

FALLBACK_LOAD_OPTIONS = {
    "attention": ["sdpa", "naive"],
    "compile": ["off", "decode"],
    "quantize": ["off", "int8", "int4"],
    "fastpath_fields": [
        {"name": "weights", "type": "choice", "default": "q", "choices": ["q", "dense"]},
        {"name": "activations", "type": "choice", "default": "f32", "choices": ["f32", "q8"]},
        {"name": "prefill_dtype", "type": "choice", "default": "auto", "choices": ["auto", "bf16", "f32", "int8"]},
        {"name": "gemm_min_rows", "type": "int", "default": 8},
        {"name": "fused_decode", "type": "bool", "default": True},
        {"name": "compile_decode", "type": "bool", "default": False},
        {"name": "pin_threads", "type": "bool", "default": False},
        {"name": "adapt_threads", "type": "bool", "default": True},
        {"name": "keep_heap", "type": "bool", "default": True},
        {"name": "on_error", "type": "choice", "default": "fallback", "choices": ["fallback", "raise"]},
    ],
}


@dataclass(frozen=True)
class EngineSettings:
    threads: int = 0  # 0 = torch's choice
    attention: str = "sdpa"
    fastpath: str = "auto"  # auto: on for a float32/bfloat16 GGUF on the CPU; on; off
    fastpath_settings: str = ""  # with fastpath "on": e.g. "activations=q8,prefill_dtype=bf16"
    compile: str = "off"  # decode: torch.compile the plain model's decode step
    quantize: str = "off"  # int8/int4 weight-only layer weights of the plain model
    context_length: int = 0  # chat: tokens of conversation + reply kept; 0 = the model's own limit

    def fastpath_spec(self) -> str:
        if self.fastpath == "on":
            return self.fastpath_settings.strip() or FASTPATH_ON_DEFAULT
        return self.fastpath

    def load_fields(self) -> dict:
        """LoadRequest fields (app.protocol) for these settings."""
        return {
            "threads": self.threads or None,
            "attention": self.attention,
            "fastpath": self.fastpath_spec(),
            "compile": self.compile,
            "quantize": self.quantize,
        }

    def with_load_fields(self, spec) -> EngineSettings:
        """These settings with the model options of a LoadRequest (what the worker really loaded)."""
        fastpath = spec.fastpath if spec.fastpath in ("auto", "off") else "on"
        settings = "" if fastpath != "on" or spec.fastpath == FASTPATH_ON_DEFAULT else spec.fastpath
        return replace(
            self,
            threads=spec.threads or 0,
            attention=spec.attention,
            fastpath=fastpath,
            fastpath_settings=settings,
            compile=spec.compile,
            quantize=spec.quantize,
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | None) -> EngineSettings:
        """Settings saved by ``to_json``; unknown or malformed entries fall back to the defaults."""
        try:
            data = json.loads(text or "{}")
        except ValueError:
            return cls()
        known = {f.name: f.type for f in fields(cls)}
        kept = {k: v for k, v in data.items() if k in known and isinstance(v, int if known[k] == "int" else str)}
        return cls(**kept)


def fastpath_spec_from(values: dict, field_specs: list[dict]) -> str:
    """``{"activations": "q8", ...}`` → "activations=q8" (only the settings that differ from the default)."""
    out = []
    for spec in field_specs:
        value = values.get(spec["name"], spec["default"])
        if value != spec["default"]:
            out.append(f"{spec['name']}={int(value) if spec['type'] == 'bool' else value}")
    return ",".join(out)


def fastpath_values_from(spec: str, field_specs: list[dict]) -> dict:
    """The inverse of ``fastpath_spec_from`` (unknown keys are kept as text; the engine reports them)."""
    values = {s["name"]: s["default"] for s in field_specs}
    types = {s["name"]: s["type"] for s in field_specs}
    for item in filter(None, (p.strip() for p in spec.split(","))):
        key, _, value = item.partition("=")
        if types.get(key) == "bool":
            values[key] = value.strip().lower() in ("1", "true", "yes", "on")
        elif types.get(key) == "int":
            values[key] = int(value) if value.strip().lstrip("-").isdigit() else values.get(key)
        else:
            values[key] = value
    return values
