"""What kind of thing a model path is, decided from ``stat`` and the first bytes, before any reader
opens it: a named pipe would block ``open``, /dev/zero would map endless zeros, and a pickle would
run code when loaded."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from opscope.engine.core.errors import (
    DuplicateEntry,
    LimitExceeded,
    NotARegularFile,
    Truncated,
    UnsafeFormat,
    WrongMetadataType,
)

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")


def check_regular_file(path: Path) -> int:
    """The size of ``path`` in bytes; NotARegularFile for a pipe, device, socket or directory,
    Truncated for an empty file."""
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
        raise NotARegularFile(path, f"is {kind}, not a model file")
    size = os.stat(path).st_size
    if size == 0:
        raise Truncated(path, "file is empty (0 bytes)")
    return size


def is_pickle(head: bytes) -> bool:
    """A pickle stream (protocol 2+) or a zip archive, the container torch.save writes."""
    return (len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5) or head[:4] == b"PK\x03\x04"


def refuse_pickle(path: Path) -> UnsafeFormat:
    return UnsafeFormat(path, "holds pickle weights (PyTorch .bin/.pt), which this engine refuses to load")


# config.json, tokenizer_config.json and shard indexes are kilobytes to a few MB; tokenizer.json
# ~35 MB for the largest vocabularies (Gemma 3's 262k tokens). Beyond these the file is hostile,
# and parsing it would take gigabytes (the JSON parsers hold several times the text in objects).
MAX_JSON_BYTES = 16 << 20
MAX_TOKENIZER_JSON_BYTES = 64 << 20
JSON_FIX = "the file is damaged or was not written by a model converter; download it again from the model's repository"


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a JSON number")


def unique_keys(path: Path, where: str = "the JSON") -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    """json object_pairs_hook: DuplicateEntry for a key given twice (the second would silently win)."""

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise DuplicateEntry(path, f"{where} names {k!r} twice")
            seen.add(k)
        return dict(pairs)

    return hook


def check_json_size(path: Path, max_bytes: int = MAX_JSON_BYTES) -> int:
    """The size of the regular file ``path``; LimitExceeded past ``max_bytes`` (before it is read)."""
    size = check_regular_file(path)
    if size > max_bytes:
        raise LimitExceeded(path, f"is {size} bytes, over the cap of {max_bytes} bytes for this JSON file", JSON_FIX)
    return size


def read_json_object(path: Path, max_bytes: int = MAX_JSON_BYTES) -> dict:
    """A JSON object from ``path``, every failure a one-line ModelLoadError naming the file: not a
    regular file, over ``max_bytes``, not UTF-8, not JSON (NaN and Infinity included: not JSON),
    nested too deeply, a key twice, or not an object."""
    check_json_size(path, max_bytes)
    try:
        obj = json.loads(
            path.read_bytes().decode("utf-8"), object_pairs_hook=unique_keys(path), parse_constant=_no_constant
        )
    except DuplicateEntry:
        raise
    except RecursionError:
        raise LimitExceeded(path, "the JSON nests too deeply to read", JSON_FIX) from None
    except UnicodeDecodeError as e:
        raise WrongMetadataType(path, f"is not UTF-8 text (byte {e.start})", JSON_FIX) from None
    except ValueError as e:  # JSONDecodeError, NaN/Infinity, an integer of more than 4300 digits
        why = "a number has more digits than any real value" if "digits" in str(e) else " ".join(str(e).split())
        raise WrongMetadataType(path, f"is not valid JSON: {why[:200]}", JSON_FIX) from None
    if not isinstance(obj, dict):
        raise WrongMetadataType(path, f"holds a JSON {json_type(obj)}, not an object", JSON_FIX)
    return obj


def json_type(v: object) -> str:
    return {
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        list: "array",
        dict: "object",
        type(None): "null",
    }.get(type(v), type(v).__name__)
