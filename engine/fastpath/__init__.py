"""CPU fast path: quantized-weight kernels swapped into a loaded model, each piece a setting.

    model = engine.fastpath.apply(model, source, FastPathOptions(activations="q8"))
"""
from engine.fastpath.apply import apply, linear_names
from engine.fastpath.options import FastPathOptions

__all__ = ["FastPathOptions", "apply", "linear_names"]
