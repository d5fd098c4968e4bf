"""Sampling filters against Hugging Face's logits processors (an independent implementation)."""

from __future__ import annotations

import pytest
import torch
from opscope.engine.generation.sampling import SamplingParams, apply_repetition_penalty, filter_logits, sample

lp = pytest.importorskip("transformers.generation.logits_process")


@pytest.fixture
def logits():
    g = torch.Generator().manual_seed(0)
    return torch.randn(3, 500, generator=g) * 3


def _kept(x: torch.Tensor) -> torch.Tensor:
    return torch.isfinite(x)


@pytest.mark.parametrize("k", [1, 5, 40])
def test_top_k(logits, k):
    ref = lp.TopKLogitsWarper(k)(None, logits.clone())
    assert torch.equal(_kept(filter_logits(logits, SamplingParams(1.0, top_k=k))), _kept(ref))


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_top_p(logits, p):
    ref = lp.TopPLogitsWarper(p)(None, logits.clone())
    assert torch.equal(_kept(filter_logits(logits, SamplingParams(1.0, top_p=p))), _kept(ref))


@pytest.mark.parametrize("m", [0.05, 0.2])
def test_min_p(logits, m):
    ref = lp.MinPLogitsWarper(m)(None, logits.clone())
    assert torch.equal(_kept(filter_logits(logits, SamplingParams(1.0, min_p=m))), _kept(ref))


def test_temperature_scales(logits):
    ref = lp.TemperatureLogitsWarper(0.7)(None, logits.clone())
    assert torch.allclose(filter_logits(logits, SamplingParams(0.7)), ref)


def test_repetition_penalty(logits):
    seen = torch.tensor([[3, 10, 10, 42]] * 3)
    ref = lp.RepetitionPenaltyLogitsProcessor(1.3)(seen, logits.clone())
    assert torch.allclose(apply_repetition_penalty(logits, seen, 1.3), ref)


def test_seeded_sampling_is_reproducible(logits):
    p = SamplingParams(0.8, top_k=50, top_p=0.9)
    a = [sample(logits, p, None, torch.Generator().manual_seed(7)).tolist() for _ in range(2)]
    assert a[0] == a[1]


def test_greedy_is_argmax(logits):
    assert torch.equal(sample(logits, SamplingParams(0.0)), logits.argmax(-1))
