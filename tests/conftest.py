"""Shared paths and fixtures. `make test` builds models/tiny.en and models/base first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MODELS_DIR = REPO / "models"
TESTDATA = (REPO / ".." / "shared" / "testdata").resolve()
AUDIO = TESTDATA / "audio"
WEIGHTS_CACHE = REPO / ".cache" / "weights"


def testdata_manifest() -> list[dict]:
    lines = (TESTDATA / "manifest.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def model_dir(name: str) -> Path:
    folder = MODELS_DIR / name
    if not (folder / "manifest.json").is_file():
        pytest.fail(f"{folder} is not built: run `make test-models` (make test does it)")
    return folder


@pytest.fixture(scope="session")
def tiny_en_dir() -> Path:
    return model_dir("tiny.en")


@pytest.fixture(scope="session")
def base_dir() -> Path:
    return model_dir("base")
