"""app.runtime.mapped_weights: a read-only file mapping's pages are dropped and read back intact."""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np

from app.runtime.mapped_weights import read_only_mappings, release, resident_bytes

SIZE = 8 << 20


def weights_file(tmp_path: Path) -> tuple[Path, bytes]:
    path = tmp_path / "graph.onnx.data"
    data = np.random.default_rng(0).integers(0, 256, SIZE, dtype=np.uint8).tobytes()
    path.write_bytes(data)
    return path, data


def test_release_drops_a_read_only_mapping_whose_bytes_read_back_unchanged(tmp_path) -> None:
    path, data = weights_file(tmp_path)
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        assert mapped[:] == data  # every page read: resident
        assert resident_bytes([path]) >= SIZE
        assert len(read_only_mappings([path])) == 1
        assert release([path]) >= SIZE
        assert resident_bytes([path]) < SIZE // 8
        assert mapped[:] == data  # faulted back in from the file


def test_writable_mappings_are_left_alone(tmp_path) -> None:
    path, data = weights_file(tmp_path)
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) as mapped:
        mapped[0] = data[0] ^ 0xFF  # a private written page: dropping it would lose this
        assert read_only_mappings([path]) == []
        assert release([path]) == 0
        assert mapped[0] == data[0] ^ 0xFF


def test_other_files_are_not_released(tmp_path) -> None:
    path, data = weights_file(tmp_path)
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        assert mapped[:] == data
        assert release([tmp_path / "other.onnx.data"]) == 0
        assert resident_bytes([path]) >= SIZE
