"""Build GGUF files byte by byte, including invalid ones: for tests of the validating reader.

A valid file is parsed with the ggml project's own ``gguf.GGUFReader`` (not OpScope's reader) into
an editable ``Craft`` (key/value list with type ids, tensor table, data section); tests then break
exactly one thing (a key twice, a value of the wrong type, an offset that overlaps) and write it.
``to_bytes()`` records in ``Craft.fields`` where every field lies (what, byte offset, size), for the
fuzz test's targeted mutations.

    craft = Craft.read("tiny.gguf"); craft.kvs.append(craft.kv("tokenizer.chat_template")); craft.write(p)
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9
U32, I32, F32, BOOL, U64 = 4, 5, 6, 7, 10


def plain_view_reader(path: str | Path):
    """``gguf.GGUFReader`` (gguf-py's own class) over a plain ndarray view of its read-only memmap:
    numpy.memmap's Python-level slicing hooks are most of the time its field walk takes on a
    49k-token vocabulary (3.2 s -> 1.1 s for the default model); the bytes and what it reads from
    them are the same."""
    import numpy as np
    from gguf.gguf_reader import GGUFReader

    class PlainViewReader(GGUFReader):
        @property
        def data(self):
            return self._plain

        @data.setter
        def data(self, mapped):  # GGUFReader.__init__ sets the memmap, then walks it
            self._plain = mapped.view(np.ndarray)

    return PlainViewReader(str(path))


@dataclass
class KV:
    key: str
    vtype: int
    value: Any
    etype: int | None = None  # element type of an array


@dataclass
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml order
    ggml_type: int
    offset: int


@dataclass
class Craft:
    kvs: list[KV]
    tensors: list[TensorInfo]
    data: bytes
    version: int = 3
    alignment: int = 32
    fields: list[tuple[str, int, int]] = field(default_factory=list)  # (what, byte offset, size) of the last to_bytes

    @classmethod
    def read(cls, path: str | Path) -> Craft:
        r = plain_view_reader(path)
        kvs = []
        for f in r.fields.values():
            if f.name.startswith("GGUF."):
                continue
            vtype = int(f.types[0])
            etype = int(f.types[1]) if vtype == ARRAY else None
            kvs.append(KV(f.name, vtype, _field_value(f, vtype, etype), etype))
        tensors = [
            TensorInfo(
                t.name, tuple(int(d) for d in t.shape), int(t.tensor_type), int(t.data_offset) - int(r.data_offset)
            )
            for t in r.tensors
        ]
        data = Path(path).read_bytes()[int(r.data_offset) :]
        align = next((int(kv.value) for kv in kvs if kv.key == "general.alignment"), 32)
        return cls(kvs, tensors, data, alignment=align)

    def kv(self, key: str) -> KV:
        return next(kv for kv in self.kvs if kv.key == key)

    def set(self, key: str, value, vtype: int | None = None, etype: int | None = None) -> Craft:
        for kv in self.kvs:
            if kv.key == key:
                kv.value, kv.vtype, kv.etype = value, vtype if vtype is not None else kv.vtype, etype
                return self
        self.kvs.append(KV(key, vtype, value, etype))
        return self

    def drop(self, key: str) -> Craft:
        self.kvs = [kv for kv in self.kvs if kv.key != key]
        return self

    def tensor(self, name: str) -> TensorInfo:
        return next(t for t in self.tensors if t.name == name)

    def to_bytes(self, n_tensors: int | None = None, n_kv: int | None = None) -> bytes:
        out = bytearray()
        self.fields = []

        def put(what: str, fmt: str, *values):
            self.fields.append((what, len(out), struct.calcsize("<" + fmt)))
            out.extend(struct.pack("<" + fmt, *values))

        def put_str(what: str, s: str | bytes):
            b = s.encode("utf-8") if isinstance(s, str) else s
            put(f"{what} length", "Q", len(b))
            out.extend(b)

        out.extend(b"GGUF")
        put("version", "I", self.version)
        put("tensor count", "Q", len(self.tensors) if n_tensors is None else n_tensors)
        put("kv count", "Q", len(self.kvs) if n_kv is None else n_kv)
        for kv in self.kvs:
            put_str(f"key {kv.key}", kv.key)
            put(f"type of {kv.key}", "I", kv.vtype)
            _put_value(put, put_str, kv.key, kv.vtype, kv.value, kv.etype)
        for t in self.tensors:
            put_str(f"tensor name {t.name}", t.name)
            put(f"dims of {t.name}", "I", len(t.shape))
            for i, d in enumerate(t.shape):
                put(f"dim {i} of {t.name}", "Q", d)
            put(f"type of {t.name}", "I", t.ggml_type)
            put(f"offset of {t.name}", "Q", t.offset)
        out.extend(b"\0" * (-len(out) % self.alignment))
        return bytes(out) + self.data

    def write(self, path: str | Path, **counts) -> Path:
        Path(path).write_bytes(self.to_bytes(**counts))
        return Path(path)


def _put_value(put, put_str, key: str, vtype: int, value, etype):
    if vtype in _SCALAR:
        put(f"value of {key}", _SCALAR[vtype], value)
    elif vtype == STRING:
        put_str(f"value of {key}", value)
    elif vtype == ARRAY:
        put(f"element type of {key}", "I", etype)
        put(f"count of {key}", "Q", len(value))
        for v in value:
            if etype == STRING:
                put_str(f"element of {key}", v)
            else:
                put(f"element of {key}", _SCALAR[etype], v)
    else:
        raise ValueError(f"cannot write value type {vtype}")


def _field_value(f, vtype: int, etype: int | None):
    def one(i):
        part = f.parts[i]
        if (etype if vtype == ARRAY else vtype) == STRING:
            return bytes(part).decode("utf-8", errors="replace")
        v = part.tolist()[0]
        return bool(v) if (etype if vtype == ARRAY else vtype) == BOOL else v

    if vtype == ARRAY:
        return [one(i) for i in f.data]
    return one(f.data[0])


def first_layers_gguf(src, dst, n_layers: int):
    """A copy of the GGUF ``src`` holding only its first ``n_layers`` blocks: the same metadata
    (tokenizer, template, hyperparameters) with {arch}.block_count set to ``n_layers``, the same
    tensors byte for byte minus blk.N.* for N >= n_layers, repacked. For
    tests whose claim holds layer by layer (a compiled step equals the eager one): the real shapes
    and weights at a fraction of the compile or run time."""
    import dataclasses
    import re

    craft = Craft.read(src)
    craft.set(f"{craft.kv('general.architecture').value}.block_count", n_layers)
    starts = sorted({t.offset for t in craft.tensors}) + [len(craft.data)]
    end = dict(zip(starts, starts[1:]))  # a tensor's bytes run up to the next tensor's start
    kept, data = [], bytearray()
    for t in craft.tensors:
        if (m := re.match(r"blk\.(\d+)\.", t.name)) and int(m[1]) >= n_layers:
            continue
        data += b"\0" * (-len(data) % craft.alignment)
        kept.append(dataclasses.replace(t, offset=len(data)))
        data += craft.data[t.offset : end[t.offset]]
    craft.tensors, craft.data = kept, bytes(data)
    return craft.write(dst)
