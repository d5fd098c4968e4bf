"""Fuzzed model files (issue 19): a few hundred mutations of a GGUF header and metadata (bit flips,
truncation, integer extremes in counts, lengths, dims, offsets and types; the tokenizer arrays'
lengths, elements and types, and the special token ids) and of a safetensors header, each run through the real CLI (`models inspect`, then a load and a one-token `generate`)
under a 2 GiB address-space cap. Every case must exit 0 or 2, and an exit 2 must be one line on
stderr naming the file: never an internal error, a crash, a hang or the memory cap.

Cases are batched: one child process runs many in a loop (each with its own stdout/stderr), the
parent kills a child that stops making progress and restarts the remaining cases in a new one.
Most mutations target the embedded model's header, written over a sparse copy so that the 94 MB
of weights are never written or read; the tiny model (engine.testing.gguf_writer) and a tiny
safetensors directory also go through a load and a one-token generate.
"""

from __future__ import annotations

import copy
import json
import os
import random
import selectors
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from gguf_craft import Craft

AS_LIMIT_BYTES = 2 << 30
CASE_TIMEOUT_S = 60.0  # a stuck case; the usual one takes milliseconds
SEED = 19

# The child: runs each case's command lines through engine.cli.main in-process, one JSON line per case.
_CHILD = r"""
import io, json, logging, sys, time
class _Err:  # logging writes to whatever sys.stderr is now (each case has its own)
    def write(self, s): sys.stderr.write(s)
    def flush(self): pass
logging.basicConfig(level=logging.WARNING, stream=_Err(), format="%(levelname)s %(name)s: %(message)s")
from opscope.engine.cli.main import main
real_out = sys.stdout
for line in sys.stdin:
    case = json.loads(line)
    real_out.write(json.dumps({"start": case["id"]}) + "\n"); real_out.flush()
    results = []
    for argv in case["argvs"]:
        sys.stdout, sys.stderr = io.StringIO(), io.StringIO()
        t0 = time.monotonic()
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 2
        except BaseException as e:
            rc = f"escaped {type(e).__name__}: {e}"
        err = sys.stderr.getvalue()
        sys.stdout, sys.stderr = real_out, sys.__stderr__
        results.append({"argv": argv, "rc": rc, "stderr": err[-2000:], "s": time.monotonic() - t0})
        if rc != 0:
            break  # a file that inspect refuses is not loaded
    real_out.write(json.dumps({"id": case["id"], "results": results}) + "\n"); real_out.flush()
"""


def _limit_memory():
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT_BYTES, AS_LIMIT_BYTES))


def _run_parallel(cases: list[dict], n: int = 2) -> tuple[dict, list[str]]:
    """_run_cases over ``n`` interleaved shares of ``cases`` at once (the CI machine has 2 cores)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(n) as pool:
        parts = list(pool.map(_run_cases, [cases[i::n] for i in range(n)]))
    return {k: v for d, _ in parts for k, v in d.items()}, [f for _, fs in parts for f in fs]


def _run_cases(cases: list[dict]) -> tuple[dict, list[str]]:
    """id → results for every case; failures for children that died or hung (the case they were on)."""
    env = {**os.environ, "MALLOC_ARENA_MAX": "2", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done, failures, todo = {}, [], list(cases)
    while todo:
        child = subprocess.Popen(
            [sys.executable, "-c", _CHILD],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            preexec_fn=_limit_memory,
            cwd=Path(__file__).resolve().parents[3],
        )
        child.stdin.write("".join(json.dumps(c) + "\n" for c in todo))
        child.stdin.close()
        current, last = None, time.monotonic()
        sel = selectors.DefaultSelector()
        sel.register(child.stdout, selectors.EVENT_READ)
        while True:
            if not sel.select(timeout=1.0):
                if time.monotonic() - last > CASE_TIMEOUT_S:
                    child.kill()
                    failures.append(f"{current}: no result after {CASE_TIMEOUT_S:.0f} s (hang)")
                    break
                continue
            line = child.stdout.readline()
            if not line:
                child.wait()
                if current is not None and current not in done:
                    failures.append(f"{current}: child died (exit {child.returncode}): {child.stderr.read()[-500:]}")
                break
            msg, last = json.loads(line), time.monotonic()
            if "start" in msg:
                current = msg["start"]
            else:
                done[msg["id"]] = msg["results"]
        child.stdout.close()
        child.stderr.close()
        child.wait()
        todo = [c for c in todo if c["id"] not in done and not any(f.startswith(f"{c['id']}:") for f in failures)]
    return done, failures


def _verdict(case: dict, results: list[dict]) -> str | None:
    for r in results:
        err = r["stderr"].strip()
        if r["rc"] not in (0, 2):
            return f"{case['id']} {' '.join(r['argv'][:2])}: exit {r['rc']}: {err[-300:]}"
        if r["rc"] == 2 and (err.count("\n") or not err.startswith("opscope: error: ") or case["path"] not in err):
            return f"{case['id']} {' '.join(r['argv'][:2])}: not one line naming the file: {err[-300:]!r}"
        if "Traceback" in err or "internal error" in err:
            return f"{case['id']}: {err[-300:]}"
    return None


# -- mutations -----------------------------------------------------------------------------------------
_EXTREMES = (0, 1, 2, 3, 7, 9, 13, 31, 32, 255, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**63 - 1, 2**64 - 1)


def _extreme(rng, size: int, old: int) -> bytes:
    values = [v for v in _EXTREMES if v < 1 << (8 * size)] + [
        max(old - 1, 0),
        (old + 1) % (1 << (8 * size)),
        (old * 2) % (1 << (8 * size)),
    ]
    return rng.choice(values).to_bytes(size, "little")


def _mutations(raw: bytes, fields: list, rng, n: int, header_end: int, skip=(0, 0)) -> list[tuple[str, bytes]]:
    """(description, mutated bytes): integer extremes in numeric fields, bit flips (outside the byte
    range ``skip``), truncations."""
    out = []
    numeric = [f for f in fields if f[2] in (4, 8)]
    for _ in range(n):
        kind = rng.random()
        b = bytearray(raw)
        if kind < 0.6:
            what, at, size = rng.choice(numeric)
            old = int.from_bytes(b[at : at + size], "little")
            b[at : at + size] = _extreme(rng, size, old)
            out.append((f"{what}={int.from_bytes(b[at : at + size], 'little')}", bytes(b)))
        elif kind < 0.85:
            at = rng.randrange(header_end - (skip[1] - skip[0]))
            at += (skip[1] - skip[0]) if at >= skip[0] else 0
            bit = rng.randrange(8)
            b[at] ^= 1 << bit
            out.append((f"bit {bit} of byte {at}", bytes(b)))
        else:
            cut = rng.randrange(4, len(raw))
            out.append((f"cut at {cut}", bytes(b[:cut])))
    return out


_VOCAB_KEYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.scores")
_ID_KEYS = (
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.padding_token_id",
    "tokenizer.ggml.unknown_token_id",
    "tokenizer.ggml.eot_token_id",
)


def _vocab_mutations(craft: Craft, rng, n: int) -> list[tuple[str, bytes]]:
    """(description, bytes) of well-formed GGUFs whose tokenizer metadata is not: arrays shortened,
    lengthened, emptied or of another element type, elements replaced by extremes or garbage
    (token types, merges without a space or of unknown tokens, empty or duplicate tokens), special
    ids at extremes, another tokenizer model or pre-tokenizer."""
    out = []
    for _ in range(n):
        c = copy.deepcopy(craft)
        key = rng.choice(_VOCAB_KEYS + _ID_KEYS + ("tokenizer.ggml.model", "tokenizer.ggml.pre"))
        if key in _ID_KEYS:
            value = rng.choice([-1, 2**31 - 1, 319, 320, 10**6])
            c.set(key, value, 5)  # int32: negative ids too
            what = f"{key}={value}"
        elif key in ("tokenizer.ggml.model", "tokenizer.ggml.pre"):
            value = rng.choice(["llama", "gemma", "bert", "", "gpt2\0", "x" * 300])
            c.set(key, value, 8)
            what = f"{key}={value[:20]!r}"
        else:
            kv = next((kv for kv in c.kvs if kv.key == key), None)
            values = list(kv.value) if kv is not None else [0.0] * 320
            etype = kv.etype if kv is not None else 6
            op = rng.randrange(5)
            if op == 0:
                values = values[: rng.randrange(len(values) + 1)]
            elif op == 1:
                values = values + values[: rng.randrange(1, 50)]
            elif op == 2 and values:
                i = rng.randrange(len(values))
                values[i] = (
                    rng.choice(["", "nospace", "a b c", "Ġ Ġ", values[0] + " zz", "\x00"])
                    if etype == 8
                    else rng.choice([-1, 7, 99, 2**31 - 1])
                    if etype in (4, 5)
                    else float("nan")
                )
            elif op == 3:
                values = []
            else:
                etype, values = rng.choice(
                    [(4, list(range(len(values)))), (6, [0.5] * len(values)), (8, [str(v) for v in values])]
                )
            c.set(key, values, 9, etype)
            what = f"{key} op {op} ({len(values)} elements)"
        out.append((what, c.to_bytes()))
    return out


def _gguf_cases(tmp: Path, tiny: Path, embedded: Path, rng) -> list[dict]:
    cases = []
    craft = Craft.read(tiny)
    raw = craft.to_bytes()
    header_end = len(raw) - len(craft.data)
    mutated = _mutations(raw, craft.fields, rng, 100, header_end) + _vocab_mutations(craft, rng, 40)
    for i, (what, data) in enumerate(mutated):
        p = tmp / f"tiny-{i}.gguf"
        p.write_bytes(data)
        cases.append(
            {
                "id": f"tiny-{i} ({what})",
                "path": str(p),
                "argvs": [["models", "inspect", str(p)], ["generate", "hi", "--model", str(p), "--max-tokens", "1"]],
            }
        )
    # the embedded model: its header fields by our own walk of the bytes, then sparse copies
    head, fields, size, vocab = _embedded_header(embedded)
    # bit flips in the 49k-token vocabulary only change token strings (the tiny model covers those)
    # while each costs a full tokenizer build: they go to the rest of the header
    for i, (what, data) in enumerate(_mutations(head, fields, rng, 100, len(head), skip=vocab)):
        p = tmp / f"emb-{i}.gguf"
        with open(p, "wb") as f:
            f.write(data)
            if len(data) == len(head):
                f.truncate(size)  # a hole: the weights are neither written nor read (inspect only)
        cases.append({"id": f"emb-{i} ({what})", "path": str(p), "argvs": [["models", "inspect", str(p)]]})
    return cases


def _embedded_header(path: Path) -> tuple[bytes, list, int, tuple[int, int]]:
    """The embedded model's header bytes (up to its data section) and (what, offset, size) of its
    numeric fields (lengths, types, counts, scalar values, dims, offsets), found with the gguf
    package's reader; the elements of long arrays (the vocabulary) are left out. Also the byte
    range of the vocabulary's tokens and merges."""
    import gguf

    r = gguf.GGUFReader(str(path))
    fields = []
    arrays = [f for f in r.fields.values() if f.name in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges")]
    vocab = (min(int(f.offset) for f in arrays), max(int(f.offset) + sum(p.nbytes for p in f.parts) for f in arrays))
    for f in list(r.fields.values()) + [t.field for t in r.tensors]:
        pos = int(f.offset)
        for part in f.parts[:6]:
            if part.dtype != np.uint8 and part.dtype.itemsize in (4, 8):
                fields += [
                    (f"{f.name} part at {pos + k}", pos + k, part.dtype.itemsize)
                    for k in range(0, part.nbytes, part.dtype.itemsize)
                ]
            pos += part.nbytes
    with open(path, "rb") as fh:
        head = fh.read(int(r.data_offset))
    return head, fields, path.stat().st_size, vocab


def _safetensors_cases(tmp: Path, tiny: Path, rng) -> list[dict]:
    from opscope.engine.formats import open_model
    from opscope.engine.formats.hf_source import hf_name
    from opscope.engine.testing.gguf_writer import hf_config
    from safetensors.numpy import save_file

    src = open_model(tiny)
    base = tmp / "st-base.safetensors"
    save_file({hf_name(n): np.ascontiguousarray(w) for n, w in src.iter_tensors()}, str(base))
    raw = base.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + n])
    cases = []
    for i in range(60):
        h = copy.deepcopy(header)
        name = rng.choice([k for k in h if k != "__metadata__"])
        kind = rng.randrange(6)
        if kind == 0:
            h[name]["dtype"] = rng.choice(["F16", "I64", "BOOL", "F99", 7, None])
        elif kind == 1:
            h[name]["shape"] = [rng.choice(_EXTREMES) for _ in h[name]["shape"]] or [2**40]
        elif kind == 2:
            h[name]["data_offsets"][rng.randrange(2)] = rng.choice(_EXTREMES)
        elif kind == 3:
            h[name]["shape"] = rng.choice(["4", [-1], [1.5], None, [[2]]])
        elif kind == 4:
            h[name] = rng.choice([None, [], "x", {"dtype": "F32"}])
        body = json.dumps(h).encode()
        data = struct.pack("<Q", len(body)) + body + raw[8 + n :]
        if kind == 5:
            b = bytearray(raw)
            pos = rng.randrange(8 + n)
            b[pos] ^= 1 << rng.randrange(8)
            data = bytes(b)
        d = tmp / f"st-{i}"
        d.mkdir()
        (d / "config.json").write_text(json.dumps(hf_config("llama")))
        src.tokenizer.backend.save(str(d / "tokenizer.json"))
        (d / "model.safetensors").write_bytes(data)
        p = str(d / "model.safetensors")
        cases.append(
            {
                "id": f"st-{i} (kind {kind}, {name})",
                "path": str(d),
                "argvs": [["models", "inspect", str(d)], ["generate", "hi", "--model", p, "--max-tokens", "1"]],
            }
        )
    return cases


@pytest.mark.slow
def test_fuzzed_model_files_exit_0_or_2_with_one_line(tmp_path, default_model_path):
    from opscope.engine.testing.gguf_writer import hf_config, write_gguf

    rng = random.Random(SEED)
    tiny = write_gguf(tmp_path / "tiny.gguf", hf_config("llama"), types="Q8_0")
    cases = _gguf_cases(tmp_path, tiny, Path(default_model_path), rng) + _safetensors_cases(tmp_path, tiny, rng)
    t0 = time.monotonic()
    done, failures = _run_parallel(cases)
    failures += [v for c in cases if c["id"] in done for v in [_verdict(c, done[c["id"]])] if v]
    rcs = [r["rc"] for c in cases if c["id"] in done for r in done[c["id"]]]
    print(
        f"{len(cases)} cases, {len(rcs)} command lines ({rcs.count(0)} exit 0, {rcs.count(2)} exit 2) in "
        f"{time.monotonic() - t0:.1f} s"
    )
    slow = sorted(
        ((r["s"], c["id"], r["argv"][0]) for c in cases if c["id"] in done for r in done[c["id"]]), reverse=True
    )
    print("slowest:", [f"{s:.2f}s {i} {a}" for s, i, a in slow[:8]])
    assert len(cases) >= 300
    assert not failures, f"{len(failures)} of {len(cases)} cases failed:\n" + "\n".join(failures[:40])
