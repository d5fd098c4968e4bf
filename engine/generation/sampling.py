"""Token sampling on the device: greedy, temperature, top-k, top-p, min-p, repetition penalty.

Order follows llama.cpp / Hugging Face: penalty on raw logits, then temperature, then the
truncations (top-k, top-p, min-p), then one multinomial draw with the request's generator.
"""

from __future__ import annotations

import torch
from opscope.engine.generation.config import SamplingParams

__all__ = ["SamplingParams", "sample", "filter_logits", "apply_repetition_penalty"]


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    # logits [B,V]; seen [S] or [B,S] token ids. CTRL's rule: divide positive logits, multiply negative.
    seen = seen.view(1, -1).expand(logits.shape[0], -1) if seen.dim() == 1 else seen
    picked = logits.gather(1, seen)
    picked = torch.where(picked > 0, picked / penalty, picked * penalty)
    return logits.scatter(1, seen, picked)


def filter_logits(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """Scaled logits with everything outside top-k / top-p / min-p set to -inf. [B,V] → [B,V]"""
    logits = logits / p.temperature
    if 0 < p.top_k < logits.shape[-1]:
        kth = torch.topk(logits, p.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if p.min_p > 0:
        probs = torch.softmax(logits, dim=-1)
        floor = probs.max(dim=-1, keepdim=True).values * p.min_p
        logits = logits.masked_fill(probs < floor, float("-inf"))
    if p.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        drop = cum - torch.softmax(sorted_logits, dim=-1) > p.top_p  # keep the token that crosses p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    return logits


def sample(
    logits: torch.Tensor, p: SamplingParams, seen: torch.Tensor | None = None, generator: torch.Generator | None = None
) -> torch.Tensor:
    """logits [B,V] → token ids [B] (on the logits' device; no host sync)."""
    logits = logits.float()
    if p.repetition_penalty != 1.0 and seen is not None and seen.numel():
        logits = apply_repetition_penalty(logits, seen, p.repetition_penalty)
    if p.temperature == 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(filter_logits(logits, p), dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
