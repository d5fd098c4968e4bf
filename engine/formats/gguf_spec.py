"""The GGUF specification's value types for the metadata keys it defines (ggml docs/gguf.md,
llama.cpp's llama-arch.cpp for the keys the spec leaves to it), checked before any value is trusted.

The declared type is checked exactly, arrays' element types included, as llama.cpp's loader does
(it refuses ``general.alignment`` stored as anything but uint32, and reads ``token_type`` as int32
whatever the file says): a uint64 alignment or a uint8 token_type array is a WrongMetadataType
naming the file, the key, the declared type and the spec's. One tolerance: the spec gives the
hyperparameter counts as uint64 while llama.cpp's converter writes them as uint32, so both pass.
"""

from __future__ import annotations

from pathlib import Path

from opscope.engine.core.errors import InvalidHyperparameters, WrongMetadataType

U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
TYPE_NAME = {
    U8: "uint8",
    I8: "int8",
    U16: "uint16",
    I16: "int16",
    U32: "uint32",
    I32: "int32",
    F32: "float32",
    BOOL: "bool",
    STRING: "string",
    U64: "uint64",
    I64: "int64",
    F64: "float64",
}
COUNT = (U32, U64)  # uint64 in the spec, uint32 from llama.cpp's converter


def arr(etype: int) -> tuple[int, int]:
    return (ARRAY, etype)


_GENERAL_STRINGS = (
    "architecture",
    "name",
    "type",
    "author",
    "version",
    "organization",
    "basename",
    "finetune",
    "description",
    "quantized_by",
    "size_label",
    "license",
    "license.name",
    "license.link",
    "url",
    "doi",
    "uuid",
    "repo_url",
    "source.url",
    "source.doi",
    "source.uuid",
    "source.repo_url",
)
_GLOBAL: dict[str, tuple] = {
    **{f"general.{k}": (STRING,) for k in _GENERAL_STRINGS},
    **{f"general.{k}": (arr(STRING),) for k in ("tags", "languages", "datasets")},
    "general.alignment": (U32,),
    "general.quantization_version": (U32,),
    "general.file_type": (U32,),
    "tokenizer.ggml.model": (STRING,),
    "tokenizer.ggml.pre": (STRING,),
    "tokenizer.ggml.tokens": (arr(STRING),),
    "tokenizer.ggml.merges": (arr(STRING),),
    "tokenizer.ggml.added_tokens": (arr(STRING),),
    "tokenizer.ggml.scores": (arr(F32),),
    "tokenizer.ggml.token_type": (arr(I32),),
    "tokenizer.ggml.add_bos_token": (BOOL,),
    "tokenizer.ggml.add_eos_token": (BOOL,),
    "tokenizer.ggml.add_space_prefix": (BOOL,),
    "tokenizer.chat_template": (STRING,),
    "tokenizer.huggingface.json": (STRING,),
}
TOKEN_ID_KEYS = tuple(
    f"tokenizer.ggml.{k}_token_id"
    for k in ("bos", "eos", "eot", "unknown", "padding", "seperator", "cls", "mask", "eom")
)
_GLOBAL.update({k: (U32,) for k in TOKEN_ID_KEYS})
USED_TOKEN_ID_KEYS = TOKEN_ID_KEYS[:3]  # bos, eos, eot: fed to or matched against the model

# keys under "{general.architecture}."
_ARCH: dict[str, tuple] = {
    "context_length": COUNT,
    "embedding_length": COUNT,
    "block_count": COUNT,
    "vocab_size": COUNT,
    # per-layer arrays are in the spec for these three (OpenELM); the engine's families refuse them
    "feed_forward_length": (*COUNT, arr(I32), arr(U32)),
    "attention.head_count": (*COUNT, arr(I32), arr(U32)),
    "attention.head_count_kv": (*COUNT, arr(I32), arr(U32)),
    "rope.dimension_count": COUNT,
    "attention.key_length": (U32,),
    "attention.value_length": (U32,),
    "expert_count": (U32,),
    "expert_used_count": (U32,),
    "use_parallel_residual": (BOOL,),
    "tensor_data_layout": (STRING,),
    "attention.layer_norm_rms_epsilon": (F32,),
    "attention.layer_norm_epsilon": (F32,),
    "attention.max_alibi_bias": (F32,),
    "attention.clamp_kqv": (F32,),
    "attention.sliding_window": (U32,),
    "attention.sliding_window_pattern": (U32, arr(BOOL), arr(I32), arr(U32)),
    "rope.freq_base": (F32,),
    "rope.freq_base_swa": (F32,),
    "rope.scale_linear": (F32,),
    "rope.scaling.type": (STRING,),
    "rope.scaling.factor": (F32,),
    "rope.scaling.original_context_length": (U32,),
    "rope.scaling.finetuned": (BOOL,),
    "attn_logit_softcapping": (F32,),
    "final_logit_softcapping": (F32,),
}


def article(kind: str) -> str:
    return ("an " if kind[0] in "aeiou" else "a ") + kind


def type_name(declared: int | tuple[int, int]) -> str:
    """uint32, array of int32, ... (an id outside the spec is named by its number)."""
    if isinstance(declared, tuple):
        etype = declared[1]
        return "array of " + ("arrays" if etype == ARRAY else TYPE_NAME.get(etype, f"type {etype}"))
    return TYPE_NAME.get(declared, f"type {declared}")


def declared_type(vtype: int, etype: int | None = None) -> int | tuple[int, int]:
    return arr(etype) if vtype == ARRAY and etype is not None else vtype


def expected_types(key: str, arch: str | None) -> tuple | None:
    if key in _GLOBAL:
        return _GLOBAL[key]
    if arch and key.startswith(arch + "."):
        return _ARCH.get(key[len(arch) + 1 :])
    return None


def check_types(path: Path, meta: dict, declared: dict) -> None:
    """Every spec-defined key is declared with the type the spec gives it (``declared``: key → the
    type id, or (ARRAY, element type id), read from the file)."""
    arch = meta.get("general.architecture")
    arch = arch if isinstance(arch, str) else None
    for key, got in declared.items():
        want = expected_types(key, arch)
        if want is None or got in want:
            continue
        raise WrongMetadataType(
            path,
            f"metadata key {key} is declared {type_name(got)} where the GGUF spec has "
            f"{' or '.join(map(type_name, want))}",
        )


def check_token_ids(path: Path, meta: dict) -> None:
    """Special-token ids must name a token of the vocabulary (an id past it indexes out of the
    embedding at generate time)."""
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list):
        return
    for key in USED_TOKEN_ID_KEYS:
        v = meta.get(key)
        if v is not None and not 0 <= int(v) < len(tokens):
            raise InvalidHyperparameters(
                path, f"metadata key {key} is {int(v)}, outside the vocabulary of {len(tokens)} tokens"
            )
