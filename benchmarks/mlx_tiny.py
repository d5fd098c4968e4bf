"""Tiny random GGUFs of every family × type with row widths every GGUF block divides (256)."""

from __future__ import annotations

from pathlib import Path

from opscope.engine.testing.gguf_writer import hf_config, write_typed_gguf

WIDE = dict(
    hidden_size=256,
    intermediate_size=512,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    vocab_size=320,
    num_hidden_layers=2,
)


def family_config(family: str) -> dict:
    extra = {"num_hidden_layers": 6} if family == "gemma3" else {}  # five local layers, one global
    return hf_config(family, **{**WIDE, **extra})


def write_family(path: Path, family: str, qtype: str) -> Path:
    return write_typed_gguf(path, family_config(family), qtype, seed=1)
