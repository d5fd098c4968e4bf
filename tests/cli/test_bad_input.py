"""Bad model input: one clear line naming the file and the reason, exit code 2, no traceback,
and nothing allocated from a hostile header before validation."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from opscope.engine.core.errors import ModelFormatError, UnsupportedModelError
from opscope.engine.formats import open_model


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "opscope.app.cli", *args], capture_output=True, text=True, timeout=120)


def _header(n_tensors: int, n_kv: int, body: bytes = b"") -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + body


def _write_gguf(path: Path, arch: str, qtype=None) -> Path:
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    data = np.zeros((4, 32), dtype=np.float32)
    if qtype is None:
        w.add_tensor("token_embd.weight", data)
    else:
        raw = gguf.quants.quantize(data, qtype)
        w.add_tensor("token_embd.weight", raw, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_missing_path(tmp_path):
    with pytest.raises(ModelFormatError, match="no such file"):
        open_model(tmp_path / "nope.gguf")


def test_directory_without_model(tmp_path):
    (tmp_path / "readme.txt").write_text("hi")
    with pytest.raises(ModelFormatError, match="holds no model"):
        open_model(tmp_path)


def test_zero_byte_file(tmp_path):
    p = tmp_path / "empty.gguf"
    p.touch()
    with pytest.raises(ModelFormatError, match="empty"):
        open_model(p)


def test_wrong_magic(tmp_path):
    p = tmp_path / "model.gguf"
    p.write_bytes(b"GGML" + b"\0" * 100)
    with pytest.raises(ModelFormatError, match="not a GGUF file"):
        open_model(p)


def test_truncated_gguf(tmp_path, default_model_path):
    p = tmp_path / "cut.gguf"
    with open(default_model_path, "rb") as f:
        p.write_bytes(f.read(20_000_000))  # header intact, tensor data cut short
    with pytest.raises(ModelFormatError, match="truncated"):
        open_model(p)


def test_truncated_inside_header(tmp_path, default_model_path):
    p = tmp_path / "cut.gguf"
    with open(default_model_path, "rb") as f:
        p.write_bytes(f.read(4096))
    with pytest.raises(ModelFormatError, match="truncated|past the end"):
        open_model(p)


@pytest.mark.parametrize(
    "body",
    [
        _header(10**12, 0),  # absurd tensor count
        _header(0, 1, struct.pack("<Q", 2**60) + b"x" * 64),  # key length 2**60
        _header(0, 1, struct.pack("<Q", 1) + b"a" + struct.pack("<IQ", 8, 1000) + b"xyz"),  # string past the end
        _header(0, 1, struct.pack("<Q", 1) + b"a" + struct.pack("<IIQ", 9, 8, 2**50) + b"\0" * 64),  # 2**50 strings
    ],
)
def test_absurd_header_is_rejected_before_allocation(tmp_path, body):
    import resource

    p = tmp_path / "hostile.gguf"
    p.write_bytes(body + b"\0" * 64)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ModelFormatError, match="corrupt GGUF header|absurd"):
        open_model(p)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 50_000  # KiB: no big allocation


def test_unsupported_architecture(tmp_path):
    p = _write_gguf(tmp_path / "bert.gguf", "bert")
    with pytest.raises(UnsupportedModelError, match="architecture 'bert'"):
        open_model(p)


def test_unsupported_quantization(tmp_path):
    import gguf

    p = _write_gguf(tmp_path / "q5.gguf", "llama", gguf.GGMLQuantizationType.Q5_0)
    with pytest.raises((UnsupportedModelError, ModelFormatError)) as info:
        open_model(p)
    assert str(p) in str(info.value)


def test_cli_prints_one_line_and_exits_2(tmp_path):
    p = tmp_path / "empty.gguf"
    p.touch()
    r = _cli("generate", "hi", "--model", str(p))
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and str(p) in r.stderr and "Traceback" not in r.stderr


def test_cli_debug_shows_traceback(tmp_path):
    r = _cli("--debug", "models", "inspect", str(tmp_path / "missing.gguf"))
    assert r.returncode != 0 and "Traceback" in r.stderr


def test_cli_bad_flag_value_is_one_line():
    r = _cli("generate", "hi", "--dtype", "int3")
    assert r.returncode == 2 and "--dtype" in r.stderr and "Traceback" not in r.stderr
