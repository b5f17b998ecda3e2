"""What a build of any family must get right beyond the arithmetic (tests/checkpoints.py):

- bf16 safetensors are read exactly;
- a tokenizer that does not fit the weights' vocabulary is refused, naming both sizes, and
  nothing is left in the models folder; one that lists the 1501 timestamp tokens (as the hub's
  tokenizer.json files do) is taken, with the same special ids;
- every graph's weights go to an external `.data` file: the manifest hashes them, the folder
  check requires them and the runtime names a missing one;
- a 128-mel, 100-language model built with the defaults (int8 files) transcribes through our
  Transcriber: long-form with timestamps and word timing, and language detection.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from app.engine.audio import decode_audio
from app.engine.languages import LANGUAGES
from app.engine.tokenizer import Tokenizer
from app.export.build import build_model
from app.export.errors import BuildError
from app.export.sources import resolve_local_folder, sha256_of
from app.runtime.contract import ContractError, Manifest, missing_files
from app.runtime.placement import RuntimeOptions
from app.runtime.sessions import WhisperSessions
from app.service.transcription.options import TranscriptionOptions
from app.service.transcription.transcriber import Transcriber
from tests.checkpoints import (
    FAMILIES,
    N_TIMESTAMPS,
    CheckpointStore,
    checkpoint_store,
    special_ids,
    tokenizer_json,
)
from tests.conftest import AUDIO, WEIGHTS_CACHE

EARNINGS = "earnings22_1_4482311_3_62.wav"  # 60 s: two windows or more


@pytest.fixture(scope="session")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CheckpointStore]:
    """Shared with the other family test module; its ~0.7 GB go at the end of the session."""
    root = tmp_path_factory.getbasetemp() / "families"
    yield checkpoint_store(root)
    shutil.rmtree(root, ignore_errors=True)


def _with_tokenizer(checkpoint: Path, tokenizer: dict, folder: Path) -> Path:
    """A copy of `checkpoint` (its weights linked) with another tokenizer.json."""
    folder.mkdir()
    for path in checkpoint.iterdir():
        if path.name != "tokenizer.json":
            (folder / path.name).symlink_to(path)
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    return folder


@pytest.mark.parametrize(
    ("family", "tokenizer_vocab"),
    [
        ("large-v3-128", 51865),  # large-v3 weights with the 99-language tokenizer
        ("multilingual-80", 51866),  # and the other way round
        ("multilingual-80", 51864),  # a multilingual model with the English-only tokenizer
        ("english-80", 51865),
    ],
)
@pytest.mark.parametrize("layout", ["hf", "ct2"])
def test_build_refuses_a_tokenizer_that_does_not_fit_the_weights(
    store: CheckpointStore, tmp_path: Path, family: str, tokenizer_vocab: int, layout: str
) -> None:
    weights = FAMILIES[family]
    source = _with_tokenizer(
        store.source(weights, layout), tokenizer_json(tokenizer_vocab), tmp_path / "source"
    )
    models = tmp_path / "models"
    with pytest.raises(BuildError) as refused:
        build_model("mismatch", models, WEIGHTS_CACHE, "int8", source, progress=False)
    message = str(refused.value)
    assert f"{tokenizer_vocab} tokens" in message
    assert f"{weights.n_vocab} rows" in message
    assert not models.exists() or not any(models.iterdir()), "a refused build left files"


def test_a_tokenizer_listing_the_timestamp_tokens_is_taken(
    store: CheckpointStore, tmp_path: Path
) -> None:
    family = FAMILIES["large-v3-128"]
    tokenizer = tokenizer_json(family.n_vocab)
    first = max(special_ids(tokenizer).values()) + 1
    template = tokenizer["added_tokens"][-1]
    tokenizer["added_tokens"] += [
        {**template, "id": first + i, "content": f"<|{i * 0.02:.2f}|>"} for i in range(N_TIMESTAMPS)
    ]
    source = _with_tokenizer(store.hf(family), tokenizer, tmp_path / "source")
    summary = build_model(
        "listed", tmp_path / "models", WEIGHTS_CACHE, "fp32", source, progress=False
    )
    assert summary is not None
    built = Manifest.load(summary.folder)
    assert built.special == Manifest.load(store.built(family, "hf")).special
    assert built.language_ids == Manifest.load(store.built(family, "hf")).language_ids
    # one token beyond the timestamps no longer fits
    tokenizer["added_tokens"].append({**template, "id": first + N_TIMESTAMPS, "content": "<|x|>"})
    (source / "tokenizer.json").write_text(json.dumps(tokenizer))
    with pytest.raises(BuildError, match=f"{family.n_vocab} rows"):
        build_model("extra", tmp_path / "models", WEIGHTS_CACHE, "fp32", source, progress=False)


def test_bf16_safetensors_are_read_exactly(store: CheckpointStore, tmp_path: Path) -> None:
    """Some fine-tunes store bf16: widened to fp32 bit for bit (numpy has no bf16)."""
    import torch
    from safetensors.torch import load_file, save_file

    family = FAMILIES["english-80"]
    source, folder = store.hf(family), tmp_path / "bf16"
    folder.mkdir()
    for path in source.iterdir():
        if path.suffix == ".safetensors":
            tensors = {k: v.to(torch.bfloat16) for k, v in load_file(path).items()}
            save_file(tensors, folder / path.name, metadata={"format": "pt"})
        else:
            (folder / path.name).symlink_to(path)
    ours = resolve_local_folder(folder).load_weights()
    original = resolve_local_folder(source).load_weights()
    assert ours.tensors.keys() == original.tensors.keys()
    for name, array in original.tensors.items():
        widened = torch.from_numpy(np.asarray(array, np.float32)).bfloat16().float().numpy()
        assert ours[name].dtype == np.float32
        np.testing.assert_array_equal(ours[name], widened, err_msg=name)
    assert build_model("bf16", tmp_path / "models", WEIGHTS_CACHE, "int8", folder, progress=False)


def test_every_graphs_weights_go_to_an_external_data_file(
    store: CheckpointStore, tmp_path: Path
) -> None:
    """External weights always (a graph over 2 GB must have them; OpenVINO maps them, so the
    runtime can drop the pages once packed): hashed in the manifest and required."""
    family = FAMILIES["distil-128"]
    summary = build_model(
        "external", tmp_path, WEIGHTS_CACHE, "int8", store.hf(family), progress=False
    )
    assert summary is not None
    folder = summary.folder
    data = {f"{graph}.onnx.data" for graph in ("encoder", "decoder")}
    assert data <= {p.name for p in folder.iterdir()}
    graph, weights = (folder / "decoder.onnx").stat().st_size, (folder / "decoder.onnx.data").stat()
    assert graph < weights.st_size / 10
    hashes = Manifest.load(folder).sha256
    assert data <= hashes.keys()
    assert all(hashes[name] == sha256_of(folder / name) for name in hashes)

    (folder / "decoder.onnx.data").unlink()
    assert missing_files(folder) == ["decoder.onnx.data"]
    with pytest.raises(ContractError, match=r"decoder\.onnx\.data"):
        WhisperSessions.load(folder, RuntimeOptions(device="CPU", threads=2))


def test_a_large_v3_shaped_model_transcribes_long_form_with_words_and_detects_the_language(
    store: CheckpointStore, tmp_path: Path
) -> None:
    family = FAMILIES["large-v3-128"]
    summary = build_model("turbo", tmp_path, WEIGHTS_CACHE, source_folder=store.hf(family))
    assert summary is not None and summary.precision == "int8"  # the default
    sessions = WhisperSessions.load(summary.folder, RuntimeOptions(device="CPU", threads=2))
    tokenizer = Tokenizer.from_folder(summary.folder)
    assert len(tokenizer.language_codes) == 100 and "yue" in tokenizer.language_codes
    transcriber = Transcriber(sessions, tokenizer)
    options = TranscriptionOptions(
        beam_size=None, temperature=0.0, word_timestamps=True, sample_len=48
    )
    audio = decode_audio(AUDIO / EARNINGS)
    segments, info = transcriber.transcribe(audio, options)
    segments = list(segments)
    assert info.language in LANGUAGES and info.language in tokenizer.language_codes
    assert info.all_language_probs is not None and len(info.all_language_probs) == 100
    assert info.duration > 30  # more than one window
    assert segments, "no segments"
    assert len({s.seek for s in segments}) >= 2, "long-form should take several windows"
    assert all(0 <= s.start <= s.end <= info.duration + 0.01 for s in segments)
    words = [w for s in segments for w in s.words or ()]
    assert words and all(w.start <= w.end for w in words)
    del sessions
    shutil.rmtree(summary.folder)
