"""CPU fast path: quantized-weight kernels swapped into a loaded model, each piece a setting.

model = engine.fastpath.apply(model, source, FastPathOptions(activations="q8"))  # a loaded model
lm = engine.fastpath.load(path, FastPathOptions())  # or straight from the GGUF's blocks (faster load)
"""

from opscope.engine.fastpath.apply import apply, linear_names
from opscope.engine.fastpath.loader import load
from opscope.engine.fastpath.options import FastPathOptions

__all__ = ["FastPathOptions", "apply", "linear_names", "load"]
