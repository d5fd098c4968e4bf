"""Build a Transformer on the meta device and attach the source's tensors without a second copy."""

from __future__ import annotations

import logging

import numpy as np
import torch
from opscope.engine.core.errors import ModelFormatError
from opscope.engine.models.transformer import Transformer

log = logging.getLogger(__name__)


def build_model(source, device: torch.device, dtype: torch.dtype, attention: str = "sdpa") -> Transformer:
    cfg = source.config
    with torch.device("meta"):
        model = Transformer(cfg, attention)
    state, freq_factors = {}, None
    for name, w in source.iter_tensors():
        t = torch.from_numpy(w) if isinstance(w, np.ndarray) else w  # shares memory: no copy
        if name == "rope_freqs":
            freq_factors = t
            continue
        # .to() is a no-op for float32 on CPU, so the dequantized buffer becomes the parameter
        state[name] = t.to(device=device, dtype=dtype)
    if cfg.tie_embeddings:
        state.setdefault("lm_head.weight", state.get("embed.weight"))
    _check_state(source, model, state)
    model.load_state_dict(state, strict=True, assign=True)
    model.tie_weights()
    model.settle_precision()
    model.set_rope(freq_factors, device)
    return model.eval().requires_grad_(False)


def _check_state(source, model: Transformer, state: dict) -> None:
    expected = {k: v.shape for k, v in model.state_dict().items()}
    missing = sorted(set(expected) - set(state))
    extra = sorted(set(state) - set(expected))
    if missing or extra:
        raise ModelFormatError(
            f"{source.path}: tensors do not match a {source.config.arch} model: "
            f"missing {missing[:4]}{'…' if len(missing) > 4 else ''}, "
            f"unexpected {extra[:4]}{'…' if len(extra) > 4 else ''}"
        )
    for k, shape in expected.items():
        if state[k] is None or tuple(state[k].shape) != tuple(shape):
            got = None if state[k] is None else tuple(state[k].shape)
            raise ModelFormatError(f"{source.path}: tensor {k} has shape {got}, the config implies {tuple(shape)}")
