"""Shared paths and fixtures. `make test` builds models/tiny.en and models/base first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MODELS_DIR = REPO / "models"
TESTDATA = REPO / "tests" / "data"
AUDIO = TESTDATA / "audio"
WEIGHTS_CACHE = REPO / ".cache" / "weights"
FP16_MODELS_DIR = REPO / ".cache" / "test-models-fp16"


def testdata_manifest() -> list[dict]:
    lines = (TESTDATA / "manifest.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def not_built(path: Path) -> None:
    """Fail the test: a model the tests need is missing (a skip would hide it in CI)."""
    pytest.fail(f"{path} is not built: run `make test-models` (make test does it)")


def model_dir(name: str) -> Path:
    folder = MODELS_DIR / name
    if not (folder / "manifest.json").is_file():
        not_built(folder)
    return folder


def fp16_model_dir(name: str) -> Path:
    """`name` built with fp16 files (once; kept in .cache). Tests that compare batched with lone
    decoding use it: with fp16 (and fp32) files OpenVINO gives a row bit-identical logits however
    many rows share the call, while its int8 compressed-weight kernels round differently at 1,
    2-3 and >= 4 rows, so a near-tie token can flip with the load (benchmarks/results/
    archive/batching_recheck.md)."""
    from app.export.build import build_model

    build_model(
        name, FP16_MODELS_DIR, WEIGHTS_CACHE, precision="fp16", skip_existing=True, progress=False
    )
    return FP16_MODELS_DIR / name


@pytest.fixture(scope="session")
def tiny_en_dir() -> Path:
    return model_dir("tiny.en")


@pytest.fixture(scope="session")
def base_dir() -> Path:
    return model_dir("base")
