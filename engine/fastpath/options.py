"""Fast-path settings: each one a switch, so the benchmarks can measure its effect alone."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from opscope.engine.core.errors import ConfigError
from opscope.engine.core.textparse import parse_bool

WEIGHTS = ("q", "dense")  # q: GGUF blocks kept quantized (fused kernels); dense: the model as loaded
ACTIVATIONS = ("f32", "q8")  # decode matvec: exact fp32 activations, or int8 activations (llama.cpp's)
# GEMM dtype of the prefill: int8 takes the int8 activations' scheme into the prefill (activations=q8
# only; a weight type without the int8 GEMM falls back to bf16 where native, else f32).
PREFILL_DTYPES = ("bf16", "f32", "int8")
# In a spec, prefill_dtype=auto (or no prefill_dtype) leaves the choice to engine.api.fastpath_options:
# with q8 activations int8 where the kernels have it; else bf16 where the CPU has native bf16 and the
# run already trades precision (q8 activations, a bf16 model).
PREFILL_AUTO = "auto"
ON_ERROR = ("fallback", "raise")


@dataclass(frozen=True)
class FastPathOptions:
    weights: str = "q"
    activations: str = "f32"
    prefill_dtype: str = "f32"  # bf16 is faster but moves logits by ~0.15 (tests state the agreement)
    gemm_min_rows: int = 8  # rows (tokens) from which a matmul dequantizes and uses a GEMM
    fused_decode: bool = True  # one C++ call per decode token (all layers), instead of the torch model
    compile_decode: bool = False  # torch.compile the single-token decode step
    pin_threads: bool = False  # bind the OpenMP threads to distinct cores
    adapt_threads: bool = True  # decode gives cores back while other processes use them (engine.cpuload)
    keep_heap: bool = True  # freed memory stays in the heap for the next pass (engine.core.heap; glibc)
    on_error: str = "fallback"  # when kernels cannot be built: keep plain torch, or raise

    def __post_init__(self):
        for field, allowed in (
            ("weights", WEIGHTS),
            ("activations", ACTIVATIONS),
            ("prefill_dtype", PREFILL_DTYPES),
            ("on_error", ON_ERROR),
        ):
            if getattr(self, field) not in allowed:
                raise ConfigError(f"fast path: {field}={getattr(self, field)!r} is not one of {', '.join(allowed)}")
        if self.prefill_dtype == "int8" and self.activations != "q8":
            raise ConfigError("fast path: prefill_dtype=int8 needs activations=q8 (the int8 scheme it extends)")
        if self.gemm_min_rows < 1:
            raise ConfigError(f"fast path: gemm_min_rows must be at least 1, got {self.gemm_min_rows}")

    def as_settings(self) -> dict:
        """Flat dict for RunResult.settings (every setting that can change a number)."""
        return {f"fastpath.{k}": v for k, v in asdict(self).items()}

    @classmethod
    def from_string(cls, spec: str, base: FastPathOptions | None = None) -> FastPathOptions:
        """``"weights=q,activations=q8,compile_decode=1"`` → options (CLI / suite parameter form);
        settings not named keep ``base``'s values (the defaults when None)."""
        kw: dict = {}
        for item in filter(None, (s.strip() for s in spec.split(","))):
            key, _, value = item.partition("=")
            if key not in cls.__dataclass_fields__:
                raise ConfigError(f"fast path: unknown setting {key!r} (known: {', '.join(cls.__dataclass_fields__)})")
            if key == "prefill_dtype" and value == PREFILL_AUTO:
                continue  # base's value: the engine's choice
            kw[key] = _parse(cls.__dataclass_fields__[key].type, value, key)
        return replace(base or cls(), **kw)


def _parse(type_name, value: str, key: str):
    if type_name in ("bool", bool):
        try:
            return parse_bool(value)
        except ValueError as e:
            raise ConfigError(f"fast path: {key} takes a boolean, got {value!r}") from e
    if type_name in ("int", int):
        try:
            return int(value)
        except ValueError as e:
            raise ConfigError(f"fast path: {key} takes an integer, got {value!r}") from e
    return value
