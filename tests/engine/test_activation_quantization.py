"""Activation quantization (int8 inputs to the int8 linear layers, OpenVINO CPU), asked for with
`STT_ACTIVATION_QUANTIZATION=on`: what it gives and what the default must not lose.

Off by default on every CPU kind (`auto`): with today's files it changes words on the kinds that
compute f32 with int8 dot products (`app.runtime.placement._activation_groups`). Asked for, it
must not make a transcript depend on the load: a row's logits alone and packed with others' are
the same (the batching scheduler packs rows by load). OpenVINO applies it only where the CPU has
int8 dot products and computes f32.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest

from app.runtime.cpu_kind import this_cpu
from app.runtime.placement import RuntimeOptions, openvino_properties
from app.runtime.sessions import WhisperSessions
from app.service.transcription.options import TranscriptionOptions
from app.service.transcription.transcriber import Transcriber
from tests.conftest import model_dir
from tests.engine.conftest import ENGLISH_CLIPS, clip, normalise

pytestmark = pytest.mark.cpu_kind  # `make test-cpus` runs it under each CPU kind

ROWS = 8
PAST = 20

needs_int8_dot_products = pytest.mark.skipif(
    not this_cpu().int8_dot_products,
    reason=f"OpenVINO quantizes activations only with int8 dot products ({this_cpu().name})",
)


@cache
def quantized(name: str) -> WhisperSessions:
    """The int8 files computing f32 with their activations quantized (asked for)."""
    options = RuntimeOptions(device="CPU", inference_precision="f32", activation_quantization="on")
    return WhisperSessions.load(model_dir(name), options)


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


@needs_int8_dot_products
@pytest.mark.parametrize("model", ["tiny.en", "base"])
def test_asked_for_a_rows_logits_do_not_depend_on_the_rows_beside_it(model) -> None:
    sessions = quantized(model)
    alone = sessions.decode(*step_inputs(sessions, 1))[0][0]
    packed = sessions.decode(*step_inputs(sessions, ROWS))[0][0]
    np.testing.assert_array_equal(alone, packed)


def test_the_default_quantizes_no_activation_on_any_cpu_kind() -> None:
    for precision in ("auto", "f32", "bf16", None):
        properties = openvino_properties("CPU", precision)
        assert properties["DYNAMIC_QUANTIZATION_GROUP_SIZE"] == "0", precision


@pytest.mark.parametrize("model", ["tiny", "base"])
def test_the_default_writes_the_exact_computations_words_on_this_cpu_kind(model, request) -> None:
    """The service's default (the int8 files, precision auto) against the exact computation
    (fp16 files, f32, nothing quantized) on the repo's English clips (punctuation may move)."""
    tok = request.getfixturevalue(f"{model}_tok")
    default = Transcriber(request.getfixturevalue(model), tok)
    exact = Transcriber(request.getfixturevalue(f"{model}_exact"), tok)
    options = TranscriptionOptions(language="en", vad_filter=False)
    for name in ENGLISH_CLIPS:
        texts = []
        for transcriber in (default, exact):
            segments, _ = transcriber.transcribe(clip(name), options)
            texts.append(normalise("".join(s.text for s in segments)))
        assert texts[0] == texts[1], (name, this_cpu().name)
