"""The test oracle itself (tests/oracle.py): HF transformers' Whisper on the weights we build from.

If these fail, every comparison against the oracle is meaningless.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from app.runtime.contract import Manifest
from tests.conftest import AUDIO, model_dir
from tests.oracle import (
    load_audio,
    normalise,
    reference_default_prefix,
    reference_features,
    reference_for,
    reference_greedy_tokens,
    reference_ids,
    reference_logits,
)

JFK = (
    "And so my fellow Americans, ask not what your country can do for you, "
    "ask what you can do for your country."
)
MODELS = ["tiny.en", "base"]


@pytest.fixture(scope="module")
def jfk_features() -> np.ndarray:
    return reference_features(load_audio(AUDIO / "jfk.wav"))


def _text(folder: Path, tokens: list[int], eot: int) -> str:
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    return tokenizer.decode([t for t in tokens if t < eot])


@pytest.mark.parametrize("name", MODELS)
def test_reference_ids_match_the_manifest(name: str) -> None:
    folder = model_dir(name)
    manifest = Manifest.load(folder)
    ids = reference_ids(manifest.dims)
    assert ids.multilingual == manifest.multilingual
    assert (ids.sot, ids.eot, ids.no_timestamps) == (
        manifest.special.sot,
        manifest.special.eot,
        manifest.special.no_timestamps,
    )
    if ids.multilingual:
        assert ids.english == manifest.language_ids["en"]
        assert ids.transcribe == manifest.special.transcribe


@pytest.mark.parametrize("name", MODELS)
def test_reference_holds_the_weights_with_a_tied_projection(name: str) -> None:
    model = reference_for(model_dir(name))
    assert model.config.tie_word_embeddings
    assert model.proj_out.weight is model.model.decoder.embed_tokens.weight
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert not model.training
    assert model.generation_config.suppress_tokens is None
    assert model.generation_config.begin_suppress_tokens is None


@pytest.mark.parametrize("name", MODELS)
def test_prefix_is_what_transformers_builds_itself(name: str, jfk_features: np.ndarray) -> None:
    model = reference_for(model_dir(name))
    ids = reference_ids(Manifest.load(model_dir(name)).dims)
    assert reference_default_prefix(model, jfk_features) == list(ids.prefix)


@pytest.mark.parametrize("name", MODELS)
def test_reference_transcribes_jfk(name: str, jfk_features: np.ndarray) -> None:
    folder = model_dir(name)
    model = reference_for(folder)
    ids = reference_ids(Manifest.load(folder).dims)
    # verify=True: generate's tokens equal a plain argmax loop (no hidden logit processors)
    tokens = reference_greedy_tokens(model, jfk_features, ids.prefix, verify=True)
    assert tokens[-1] == ids.eot
    assert normalise(_text(folder, tokens, ids.eot)) == normalise(JFK)


def test_reference_logits_depend_on_the_audio(jfk_features: np.ndarray) -> None:
    """A reference that ignored the encoder (e.g. zero cross-attention weights) would pass the
    transcript test only by luck; silence must give other first-step logits."""
    folder = model_dir("tiny.en")
    model = reference_for(folder)
    ids = reference_ids(Manifest.load(folder).dims)
    silence = reference_features(np.zeros(16000, np.float32))
    speech_logits = reference_logits(model, jfk_features, [list(ids.prefix)])
    silent_logits = reference_logits(model, silence, [list(ids.prefix)])
    assert np.abs(speech_logits - silent_logits).max() > 1.0
