"""Activation quantization (int8 inputs to the int8 linear layers, OpenVINO CPU): what it may
change and what it must not.

It is on by default where the CPU computes f32 and has int8 dot products (VNNI or AMX;
`STT_ACTIVATION_QUANTIZATION=auto`). It must not
make a transcript depend on the load (a row's logits alone and packed with others' must be the
same: the batching scheduler packs rows by load), and it must write the words the exact
computation writes on the repo's clips (punctuation may move: logits differ by up to ~0.3).
"""

from __future__ import annotations

import numpy as np
import pytest

from app.runtime.sessions import WhisperSessions, openvino_properties
from app.service.options import TranscriptionOptions
from app.service.transcriber import Transcriber
from tests.engine.conftest import ENGLISH_CLIPS, clip, normalise

pytestmark = pytest.mark.cpu_kind  # `make test-cpus` runs it under each CPU kind

ROWS = 8
PAST = 20


def quantizes_by_default() -> bool:
    groups = openvino_properties("CPU", "auto")["DYNAMIC_QUANTIZATION_GROUP_SIZE"]
    return groups != "0"


needs_default_on = pytest.mark.skipif(
    not quantizes_by_default(),
    reason="activation quantization is off by default on this CPU (it computes bf16, or it has no"
    " int8 dot products (VNNI/AMX) for OpenVINO to quantize with)",
)


def step_inputs(sessions: WhisperSessions, rows: int) -> tuple:
    """One decoder step of `rows` rows, each on its own window and past (seeded)."""
    d = sessions.manifest.dims
    rng = np.random.default_rng(0)
    features = rng.standard_normal((ROWS, d.n_mels, 3000)).astype(np.float32)
    cross = [c[:rows] for c in sessions.encode(features)]
    past = [
        rng.standard_normal((ROWS, d.n_heads, PAST, d.head_dim), dtype=np.float32)[:rows]
        for _ in range(2 * d.n_text_layer)
    ]
    ids = np.full((rows, 1), 440, np.int64)
    positions = np.full((rows, 1), PAST, np.int64)
    return ids, positions, np.ones((rows, PAST + 1), np.int64), past, cross


@needs_default_on
@pytest.mark.parametrize("model", ["tiny", "base"])
def test_a_rows_logits_do_not_depend_on_the_rows_beside_it(model, request) -> None:
    sessions = request.getfixturevalue(model)
    alone = sessions.decode(*step_inputs(sessions, 1))[0][0]
    packed = sessions.decode(*step_inputs(sessions, ROWS))[0][0]
    np.testing.assert_array_equal(alone, packed)


@needs_default_on
@pytest.mark.parametrize("model", ["tiny", "base"])
def test_same_words_as_the_exact_computation(model, request) -> None:
    tok = request.getfixturevalue(f"{model}_tok")
    quantized = Transcriber(request.getfixturevalue(model), tok)
    exact = Transcriber(request.getfixturevalue(f"{model}_exact"), tok)
    options = TranscriptionOptions(language="en", vad_filter=False)
    for name in ENGLISH_CLIPS:
        texts = []
        for transcriber in (quantized, exact):
            segments, _ = transcriber.transcribe(clip(name), options)
            texts.append(normalise("".join(s.text for s in segments)))
        assert texts[0] == texts[1], name
