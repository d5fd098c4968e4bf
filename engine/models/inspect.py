"""A model source described for people: what `opscope models inspect` prints."""
from __future__ import annotations


def describe(source) -> dict:
    cfg = source.config
    tok = source.tokenizer
    return {
        "path": str(source.path),
        "format": source.format,
        "architecture": cfg.arch,
        "parameters": cfg.n_params,
        "parameters_human": _human(cfg.n_params),
        "layers": cfg.n_layers,
        "dim": cfg.dim,
        "heads": f"{cfg.n_heads} query / {cfg.n_kv_heads} kv, head dim {cfg.head_dim}",
        "ffn_dim": cfg.hidden_dim,
        "vocab_size": cfg.vocab_size,
        "context_length": cfg.max_seq_len,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": cfg.rope_scaling.kind if cfg.rope_scaling else "none",
        "tied_embeddings": cfg.tie_embeddings,
        "quantization": source.quant_summary,
        "file_size_bytes": source.file_size_bytes,
        "file_size": _human(source.file_size_bytes, "B", 1024),
        "tokenizer": f"{tok.backend.get_vocab_size()} tokens, bos={tok.bos_id}, eos={list(tok.eos_ids)}, "
                     f"add_bos={tok.add_bos}",
        "chat_template": "present" if tok.chat_template else "absent (ChatML fallback)",
    }


def _human(n: float, unit: str = "", base: int = 1000) -> str:
    for prefix in ("", "K", "M", "G", "T"):
        if abs(n) < base:
            return f"{n:.1f} {prefix}{unit}".strip()
        n /= base
    return f"{n:.1f} P{unit}"
