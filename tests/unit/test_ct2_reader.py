"""The CTranslate2 model.bin reader on synthetic files (format edge cases, errors)."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from app.export.ct2 import read_model_bin
from app.export.errors import BuildError


def _string(text: str) -> bytes:
    raw = text.encode() + b"\0"
    return struct.pack("<H", len(raw)) + raw


def _model_bin(variables: dict[str, np.ndarray], aliases: dict[str, str], spec="WhisperSpec"):
    dtype_ids = {np.dtype(np.float32): 0, np.dtype(np.int8): 1, np.dtype(np.float16): 4}
    out = struct.pack("<I", 6) + _string(spec) + struct.pack("<I", 3)
    out += struct.pack("<I", len(variables))
    for name, array in variables.items():
        out += _string(name) + struct.pack("<B", array.ndim)
        out += struct.pack(f"<{array.ndim}I", *array.shape)
        out += struct.pack("<B", dtype_ids[array.dtype]) + struct.pack("<I", array.nbytes)
        out += array.tobytes()
    out += struct.pack("<I", len(aliases))
    for alias, target in aliases.items():
        out += _string(alias) + _string(target)
    return out


VARIABLES = {
    "decoder/embeddings/weight": np.arange(12, dtype=np.float16).reshape(4, 3),
    "decoder/num_heads": np.array(6, dtype=np.int8),
    "encoder/conv1/bias": np.array([0.5, -1.5], dtype=np.float32),
}


def test_reads_names_shapes_dtypes_and_aliases(tmp_path: Path) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(
        _model_bin(VARIABLES, {"decoder/projection/weight": "decoder/embeddings/weight"})
    )
    variables = read_model_bin([path])
    assert set(variables) == {*VARIABLES, "decoder/projection/weight"}
    for name, array in VARIABLES.items():
        assert variables[name].dtype == array.dtype
        np.testing.assert_array_equal(variables[name], array)
    assert variables["decoder/projection/weight"] is variables["decoder/embeddings/weight"]


def test_joins_parts_split_anywhere(tmp_path: Path) -> None:
    data = _model_bin(VARIABLES, {})
    cut = len(data) // 2 + 3  # inside a variable's bytes
    (tmp_path / "model.bin.part1").write_bytes(data[:cut])
    (tmp_path / "model.bin.part2").write_bytes(data[cut:])
    parts = [tmp_path / "model.bin.part1", tmp_path / "model.bin.part2"]
    np.testing.assert_array_equal(
        read_model_bin(parts)["decoder/embeddings/weight"], VARIABLES["decoder/embeddings/weight"]
    )


@pytest.mark.parametrize("keep", [10, 40, -5])
def test_truncated_file_is_a_clear_error(tmp_path: Path, keep: int) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(_model_bin(VARIABLES, {})[:keep])
    with pytest.raises(BuildError, match="truncated"):
        read_model_bin([path])


def test_not_a_model_file(tmp_path: Path) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(b"<html>404 not found</html>" * 10)
    with pytest.raises(BuildError, match="not a CTranslate2"):
        read_model_bin([path])


def test_other_model_spec_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(_model_bin(VARIABLES, {}, spec="TransformerSpec"))
    with pytest.raises(BuildError, match="not a Whisper model"):
        read_model_bin([path])


def test_trailing_garbage_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(_model_bin(VARIABLES, {}) + b"\0\0\0")
    with pytest.raises(BuildError, match="trailing"):
        read_model_bin([path])


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match="cannot read"):
        read_model_bin([tmp_path / "nope.bin"])
