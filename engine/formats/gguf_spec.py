"""The GGUF specification's value types for the metadata keys the engine reads (ggml docs/gguf.md,
llama.cpp's llama-arch.cpp), checked before any value is trusted.

A string where a count belongs, or a float block count that ``int()`` would turn into 0, is a
WrongMetadataType naming the file, the key and both types. Integer widths are not enforced
(converters write counts as uint32 or uint64 alike); the kind is: integer, float (an integer is
accepted for a float), string, bool, or an array of one of those.
"""
from __future__ import annotations

from pathlib import Path

from opscope.engine.core.errors import InvalidHyperparameters, WrongMetadataType

INT, FLOAT, STR, BOOL = "integer", "float", "string", "bool"
# GGUF value type id → kind
KIND = {0: INT, 1: INT, 2: INT, 3: INT, 4: INT, 5: INT, 10: INT, 11: INT, 6: FLOAT, 12: FLOAT, 7: BOOL, 8: STR}
ARRAY = 9

_GLOBAL: dict[str, tuple[str, ...]] = {
    "general.architecture": (STR,), "general.alignment": (INT,), "general.quantization_version": (INT,),
    "general.file_type": (INT,), "general.name": (STR,),
    "tokenizer.ggml.model": (STR,), "tokenizer.ggml.pre": (STR,),
    "tokenizer.ggml.tokens": ("array of " + STR,), "tokenizer.ggml.merges": ("array of " + STR,),
    "tokenizer.ggml.scores": ("array of " + FLOAT,), "tokenizer.ggml.token_type": ("array of " + INT,),
    "tokenizer.ggml.add_bos_token": (BOOL,), "tokenizer.ggml.add_eos_token": (BOOL,),
    "tokenizer.ggml.add_space_prefix": (BOOL,), "tokenizer.chat_template": (STR,),
}
TOKEN_ID_KEYS = tuple(f"tokenizer.ggml.{k}_token_id" for k in
                      ("bos", "eos", "eot", "unknown", "padding", "seperator", "cls", "mask", "eom"))
_GLOBAL.update({k: (INT,) for k in TOKEN_ID_KEYS})
USED_TOKEN_ID_KEYS = TOKEN_ID_KEYS[:3]  # bos, eos, eot: fed to or matched against the model

# keys under "{general.architecture}."
_ARCH: dict[str, tuple[str, ...]] = {
    # per-layer arrays are in the spec for these three (OpenELM); the engine's families refuse them
    "context_length": (INT,), "embedding_length": (INT,), "block_count": (INT,),
    "feed_forward_length": (INT, "array of " + INT), "vocab_size": (INT,),
    "attention.head_count": (INT, "array of " + INT), "attention.head_count_kv": (INT, "array of " + INT),
    "attention.key_length": (INT,), "attention.value_length": (INT,),
    "attention.layer_norm_rms_epsilon": (FLOAT,), "attention.layer_norm_epsilon": (FLOAT,),
    "attention.sliding_window": (INT,),
    "attention.sliding_window_pattern": (INT, "array of " + BOOL, "array of " + INT),
    "rope.freq_base": (FLOAT,), "rope.freq_base_swa": (FLOAT,), "rope.dimension_count": (INT,),
    "rope.scaling.type": (STR,), "rope.scaling.factor": (FLOAT,),
    "rope.scaling.original_context_length": (INT,),
    "attn_logit_softcapping": (FLOAT,), "final_logit_softcapping": (FLOAT,),
}


def article(kind: str) -> str:
    return ("an " if kind[0] in "aeiou" else "a ") + kind


def kind_of(vtype: int, etype: int | None = None) -> str:
    if vtype == ARRAY:
        return "array of " + ("array" if etype == ARRAY or etype is None else KIND.get(etype, f"type {etype}"))
    return KIND.get(vtype, f"type {vtype}")


def expected_kinds(key: str, arch: str | None) -> tuple[str, ...] | None:
    if key in _GLOBAL:
        return _GLOBAL[key]
    if arch and key.startswith(arch + "."):
        return _ARCH.get(key[len(arch) + 1:])
    return None


def check_types(path: Path, meta: dict, kinds: dict[str, str]) -> None:
    """Every known key's value has the kind the spec gives it (``kinds``: key → kind read)."""
    arch = meta.get("general.architecture")
    arch = arch if isinstance(arch, str) else None
    for key, got in kinds.items():
        want = expected_kinds(key, arch)
        if want is None or got in want or (got == INT and FLOAT in want) or (got == "array of " + INT and
                                                                            "array of " + FLOAT in want):
            continue
        raise WrongMetadataType(path, f"metadata key {key} holds {article(got)} where the GGUF spec has "
                                      f"{' or '.join(map(article, want))}")


def check_token_ids(path: Path, meta: dict) -> None:
    """Special-token ids must name a token of the vocabulary (an id past it indexes out of the
    embedding at generate time)."""
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list):
        return
    for key in USED_TOKEN_ID_KEYS:
        v = meta.get(key)
        if v is not None and not 0 <= int(v) < len(tokens):
            raise InvalidHyperparameters(path, f"metadata key {key} is {int(v)}, outside the vocabulary of "
                                               f"{len(tokens)} tokens")
