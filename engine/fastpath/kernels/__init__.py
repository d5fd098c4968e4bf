"""CPU kernels for weights kept in the GGUF's quantized form (fused dequantize-matvec, prefill GEMM)."""

from opscope.engine.fastpath.kernels.build import KernelBuildError, int8_prefill, load_kernels, native_bf16
from opscope.engine.fastpath.kernels.packing import PackedWeight, dequantize_reference, pack, supported

__all__ = [
    "KernelBuildError",
    "PackedWeight",
    "dequantize_reference",
    "int8_prefill",
    "load_kernels",
    "native_bf16",
    "pack",
    "supported",
]
