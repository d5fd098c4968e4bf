"""The unit of each benchmark parameter, as the Benchmarks panel shows it ("pp: 512 tokens").

Suites declare plain dataclass fields (engine/bench/suites/*.py); the unit a person reads is the
GUI's concern, so it lives here, keyed by field name with a per-suite override where one name means
different things in different suites.
"""
from __future__ import annotations

UNITS = {
    "pp": "tokens", "tg": "tokens", "depths": "tokens", "gen_prompt": "tokens", "gen_tokens": "tokens",
    "seq_lens": "tokens", "prompt": "tokens", "steps": "tokens", "seq": "tokens",
    "batch": "sequences", "batches": "sequences",
    "sizes_bytes": "bytes", "call_budget_s": "s", "planted_slowdown": "×", "reps": "repetitions",
    "heads": "heads", "n_heads": "heads", "n_kv_heads": "heads", "n_layers": "layers",
    "head_dim": "elements", "dim": "elements", "hidden_dim": "elements", "vocab_size": "tokens",
    "sizes": "n×n",
}
SUITE_UNITS = {
    ("crossover", "matmul"): "n×n", ("crossover", "attention"): "tokens",
    ("crossover", "decode"): "hidden size",
}


def param_unit(suite: str, name: str) -> str:
    """The unit of parameter ``name`` of ``suite``; "" for a plain number or a name list."""
    return SUITE_UNITS.get((suite, name), UNITS.get(name, ""))
