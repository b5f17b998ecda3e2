"""Every Whisper family, built by our exporter from both layouts, against transformers.

For each family of `tests/checkpoints.py` (80-mel multilingual, 80-mel English-only, large-v3 /
turbo with 128 mels and 51866 tokens, distil with 2 decoder layers) a random-weight checkpoint of
the family's real structure is written in the Transformers layout and converted by CTranslate2
(float16, or int8 for large-v3 as the hub's turbo conversions are), built (fp32 files, the
precision these tolerances are for) and run on the OpenVINO EP:

- the manifest follows the family (mel bins, vocabulary, language tokens, special ids by
  openai/whisper's rules, alignment heads from the generation config or the default);
- logits along a transcript within TOLERANCE of transformers' on the same weights (the
  Transformers folder loaded by `from_pretrained`; an int8 CTranslate2 folder's dequantized
  weights, which are checked against the original checkpoint to within one quantization step);
- greedy tokens equal transformers' `generate` on real clips' features, the reference's top
  token leading by at least MARGIN at every step (the checkpoints are made decisive).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from app.engine.languages import LANGUAGES
from app.export.manifest import default_alignment_heads
from app.export.sources import resolve_local_folder
from app.runtime.contract import Manifest
from app.runtime.placement import RuntimeOptions
from app.runtime.sessions import WhisperSessions
from tests.checkpoints import FAMILIES, LANGUAGE_COUNT, CheckpointStore, Family, checkpoint_store
from tests.oracle import (
    TORCH_THREADS,
    ReferenceIds,
    _generation_config,
    build_reference,
    reference_greedy_tokens,
    reference_ids,
    reference_logits,
)

TOLERANCE = 1e-3  # max abs logit difference, fp32 graphs (as test_graphs_vs_reference.py)
# The reference's top token leads the second by this much at every greedy step: with every
# logit within TOLERANCE, our argmax can only differ where the lead is below 2 * TOLERANCE.
MARGIN = 10 * TOLERANCE
AUDIO_EFFECT = 100 * TOLERANCE  # two clips' logits differ by this much: the encoder counts
# transformers 5.24's `generate` gives other encoder states on these checkpoints once
# max_new_tokens exceeds ~26 (its step-0 logits then differ from its own forward's by ~0.4);
# up to 24 its tokens are its forward's argmax, which the greedy test checks.
NEW_TOKENS = 24
CLIPS = ("jfk.wav", "1089-134686-0000.flac")
LAYOUTS = ("hf", "ct2")


@pytest.fixture(scope="session")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CheckpointStore]:
    """Shared with the other family test module; its ~0.7 GB go at the end of the session."""
    root = tmp_path_factory.getbasetemp() / "families"
    yield checkpoint_store(root)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request: pytest.FixtureRequest) -> Family:
    return FAMILIES[request.param]


@pytest.fixture(scope="module", params=LAYOUTS)
def layout(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def folder(store: CheckpointStore, family: Family, layout: str) -> Path:
    return store.built(family, layout)


@pytest.fixture(scope="module")
def sessions(folder: Path) -> Iterator[WhisperSessions]:
    loaded = WhisperSessions.load(folder, RuntimeOptions(device="CPU", threads=2))
    yield loaded
    del loaded


@pytest.fixture(scope="module")
def ids(folder: Path) -> ReferenceIds:
    return reference_ids(Manifest.load(folder).dims)


@pytest.fixture(scope="module")
def reference(store: CheckpointStore, family: Family, layout: str, ids: ReferenceIds):
    """transformers' Whisper holding the weights the build read, fp32, eager attention."""
    import torch
    from transformers import WhisperForConditionalGeneration

    if layout == "ct2":  # the converted weights (checked against the checkpoint below)
        return build_reference(resolve_local_folder(store.source(family, layout)).load_weights())
    torch.set_num_threads(TORCH_THREADS)
    model = WhisperForConditionalGeneration.from_pretrained(
        store.hf(family), torch_dtype=torch.float32, attn_implementation="eager"
    ).eval()
    model.generation_config = _generation_config(ids)
    return model


def _generated(
    store: CheckpointStore, reference, family: Family, layout: str, clip: str, ids: ReferenceIds
) -> tuple[list[int], np.ndarray]:
    """transformers' `generate` tokens on `clip` and its forward's logits [1, T, V] over the
    prefix and those tokens (once per model and clip)."""

    def make() -> tuple[list[int], np.ndarray]:
        features = store.features(clip, family.n_mels)
        tokens = reference_greedy_tokens(reference, features, ids.prefix, NEW_TOKENS)
        return tokens, reference_logits(reference, features, [[*ids.prefix, *tokens]])

    return store.once(("generated", family.name, layout, clip), make)


def _greedy(s: WhisperSessions, features: np.ndarray, prefix: tuple[int, ...]) -> list[int]:
    """Plain greedy argmax with our graphs: a prefill of the prefix, then one token per call."""
    cross = s.encode(features)
    tokens = list(prefix)
    past = s.empty_past(1)
    new: list[int] = []
    while len(new) < NEW_TOKENS:
        start = len(tokens) - (1 if new else len(prefix))
        logits, kv = s.decode(
            np.array([tokens[start:]], np.int64),
            np.arange(start, len(tokens), dtype=np.int64)[None],
            np.ones((1, len(tokens)), np.int64),
            past,
            cross,
        )
        past = [np.concatenate([p, k], axis=2) for p, k in zip(past, kv, strict=True)]
        new.append(int(logits[0, -1].argmax()))
        tokens.append(new[-1])
        if new[-1] == s.manifest.special.eot:
            break
    return new


# ------------------------------------------------------------------------------------ tests


def test_manifest_follows_the_family(folder: Path, family: Family, ids: ReferenceIds) -> None:
    manifest = Manifest.load(folder)
    dims, special = manifest.dims, manifest.special
    assert (dims.n_mels, dims.n_vocab) == (family.n_mels, family.n_vocab)
    assert (dims.n_audio_layer, dims.n_text_layer) == (family.encoder_layers, family.decoder_layers)
    assert manifest.multilingual == family.multilingual
    # special ids as openai/whisper's tokenizer rules place them for this vocabulary size
    assert (special.sot, special.eot, special.no_timestamps) == (
        ids.sot,
        ids.eot,
        ids.no_timestamps,
    )
    assert special.timestamp_begin + 1501 == family.n_vocab
    languages = list(LANGUAGES)[: LANGUAGE_COUNT[family.n_vocab]]
    if family.multilingual:
        assert manifest.language_ids == {c: ids.sot + 1 + i for i, c in enumerate(languages)}
        assert special.transcribe == ids.transcribe
        assert special.translate == ids.sot + 1 + len(languages)
        assert ("yue" in manifest.language_ids) == (family.n_vocab == 51866)
    else:
        assert manifest.language_ids == {"en": ids.sot + 1}
    expected_heads = family.alignment_heads or default_alignment_heads(dims)
    assert manifest.alignment_heads == tuple(expected_heads)


def test_ct2_weights_are_the_checkpoints(store: CheckpointStore, family: Family) -> None:
    """What our reader takes from the CTranslate2 folder is the checkpoint: exactly, or rounded
    to fp16 (a float16 conversion of fp32 weights), or within half a quantization step of each
    row plus fp16 rounding (int8: CTranslate2 stores round(w * 127 / max|row|))."""
    ct2 = resolve_local_folder(store.source(family, "ct2")).load_weights()
    hf = resolve_local_folder(store.hf(family)).load_weights()
    assert ct2.tensors.keys() == hf.tensors.keys()
    quantized = 0
    for name, original in hf.tensors.items():
        ours = np.asarray(ct2[name], np.float32)
        as_fp16 = np.asarray(original, np.float16).astype(np.float32)
        if family.ct2_quantization == "float16" or original.ndim < 2 or "embed_positions" in name:
            np.testing.assert_array_equal(ours, as_fp16, err_msg=name)
            continue
        rows = np.abs(np.asarray(original, np.float32)).reshape(len(original), -1).max(axis=1)
        error = np.abs(ours - as_fp16).reshape(len(original), -1).max(axis=1)
        assert (error <= rows / 127 * (0.5 + 127 * 2.0**-11) * 1.001).all(), name
        quantized += not np.array_equal(ours, as_fp16)
    assert family.ct2_quantization == "float16" or quantized > 0


def test_logits_along_a_transcript_match_transformers(
    store: CheckpointStore,
    family: Family,
    layout: str,
    sessions: WhisperSessions,
    reference,
    ids: ReferenceIds,
) -> None:
    features = store.features(CLIPS[0], family.n_mels)
    generated, theirs = _generated(store, reference, family, layout, CLIPS[0], ids)
    tokens = [*ids.prefix, *generated]
    ours, _ = sessions.decode(
        np.array([tokens], np.int64),
        np.arange(len(tokens), dtype=np.int64)[None],
        np.ones((1, len(tokens)), np.int64),
        sessions.empty_past(1),
        sessions.encode(features),
    )
    assert ours.shape == theirs.shape == (1, len(tokens), family.n_vocab)
    assert float(np.abs(ours - theirs).max()) <= TOLERANCE
    other_clip = reference_logits(reference, store.features(CLIPS[1], family.n_mels), [tokens])
    assert float(np.abs(other_clip - theirs).max()) >= AUDIO_EFFECT


@pytest.mark.parametrize("clip", CLIPS)
def test_greedy_tokens_equal_transformers_generate(
    store: CheckpointStore,
    family: Family,
    layout: str,
    sessions: WhisperSessions,
    reference,
    ids: ReferenceIds,
    clip: str,
) -> None:
    expected, logits = _generated(store, reference, family, layout, clip, ids)
    along = logits[0, len(ids.prefix) - 1 : -1]  # [new tokens, V]: what chose each token
    # generate's tokens are its forward's argmax (it applies no logit processor here)
    assert along.argmax(-1).tolist() == expected
    top2 = np.sort(along, axis=-1)[:, -2:]
    assert float((top2[:, 1] - top2[:, 0]).min()) >= MARGIN, "the checkpoint is not decisive"
    assert len(set(expected)) > 3, f"a degenerate reference transcript: {expected}"
    assert _greedy(sessions, store.features(clip, family.n_mels), ids.prefix) == expected
