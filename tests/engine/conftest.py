"""Fixtures for the decoding-engine tests: real model sessions (loaded once per test session),
tokenizers, transcribers and the testdata clips.

Models come from `make test-models` (`make test` builds them first); without them these tests
fail with that advice, as the API tests do.
"""

from __future__ import annotations

import re
from functools import cache

import numpy as np
import pytest

from app.engine.audio import decode_audio
from app.engine.mel import log_mel_spectrogram, pad_or_trim
from app.engine.tokenizer import Tokenizer
from app.engine.vad import VAD_FILE, SileroVad
from app.runtime.contract import N_SAMPLES_PER_WINDOW, SAMPLE_RATE
from app.runtime.placement import RuntimeOptions
from app.runtime.sessions import WhisperSessions
from app.service.transcription.transcriber import Transcriber
from tests.conftest import (
    AUDIO,
    MODELS_DIR,
    fp16_model_dir,
    model_dir,
    not_built,
    testdata_manifest,
)

ENGLISH_CLIPS = [
    e["file"].removeprefix("audio/") for e in testdata_manifest() if e["language"] == "en"
]
REFERENCES = {e["file"].removeprefix("audio/"): e["text"] for e in testdata_manifest()}
JFK = "jfk.flac"
EARNINGS = "earnings22_1_4482311_3_62.wav"
EMPTY = "picovoice_empty.wav"
SPANISH = "picovoice_test_es.wav"


@cache
def _sessions(name: str, ep: str, activation_quantization: str = "auto") -> WhisperSessions:
    options = RuntimeOptions(ep=ep, device="CPU", activation_quantization=activation_quantization)
    return WhisperSessions.load(model_dir(name), options)


def _exact(name: str) -> WhisperSessions:
    options = RuntimeOptions(device="CPU", inference_precision="f32", activation_quantization="off")
    return WhisperSessions.load(fp16_model_dir(name), options)


@cache
def _tokenizer(name: str) -> Tokenizer:
    folder = model_dir(name)
    return Tokenizer.from_folder(folder)


@cache
def clip(name: str) -> np.ndarray:
    """A testdata clip as f32 [N] mono 16 kHz (cached)."""
    audio = decode_audio(AUDIO / name)
    audio.flags.writeable = False
    return audio


def window_features(sessions: WhisperSessions, audio: np.ndarray) -> np.ndarray:
    """The encoder's input f32 [1, n_mels, 3000] for the first 30 s window of `audio`."""
    mel = log_mel_spectrogram(
        audio[:N_SAMPLES_PER_WINDOW], sessions.manifest.dims.n_mels, padding=N_SAMPLES_PER_WINDOW
    )
    return np.ascontiguousarray(pad_or_trim(mel)[None])


def window_cross(sessions: WhisperSessions, audio: np.ndarray) -> list[np.ndarray]:
    """Cross K/V [1, H, 1500, Dh] per layer of the first 30 s window of `audio`."""
    return sessions.encode(window_features(sessions, audio))


def normalise(text: str) -> str:
    """Case and punctuation folded, whitespace collapsed (for exact-text checks)."""
    text = re.sub(r"[^\w\s']", " ", text.lower())
    return " ".join(text.split())


def seconds(n: float) -> int:
    return int(n * SAMPLE_RATE)


@pytest.fixture(scope="session")
def tiny() -> WhisperSessions:
    return _sessions("tiny.en", "openvino")


@pytest.fixture(scope="session")
def tiny_fp16() -> WhisperSessions:
    """tiny.en with fp16 files (`tests.conftest.fp16_model_dir`), on OpenVINO."""
    return WhisperSessions.load(fp16_model_dir("tiny.en"), RuntimeOptions(device="CPU"))


@pytest.fixture(scope="session")
def tiny_cpu() -> WhisperSessions:
    """tiny.en with fp16 files (as `tiny_fp16`) on ONNX Runtime's CPU provider."""
    return WhisperSessions.load(fp16_model_dir("tiny.en"), RuntimeOptions(ep="cpu"))


@pytest.fixture(scope="session")
def base() -> WhisperSessions:
    return _sessions("base", "openvino")


@pytest.fixture(scope="session")
def tiny_exact() -> WhisperSessions:
    """tiny.en with nothing quantized: fp16 files on OpenVINO, computing f32. A call's logits then
    do not depend on how many tokens it feeds, so decoding strategies that feed the same tokens
    differently can be compared exactly. Not the int8 files: their logits projection takes int8
    inputs, so an input that differs in its last bits between two ways of feeding it can cross a
    rounding edge and move a logit by a whole int8 step (~0.03); with OpenVINO's dynamic
    activation quantization on, logits move by up to ~0.3."""
    return _exact("tiny.en")


@pytest.fixture(scope="session")
def base_exact() -> WhisperSessions:
    """base, nothing quantized (see `tiny_exact`)."""
    return _exact("base")


@pytest.fixture(scope="session")
def tiny_tok() -> Tokenizer:
    return _tokenizer("tiny.en")


@pytest.fixture(scope="session")
def base_tok() -> Tokenizer:
    return _tokenizer("base")


@pytest.fixture(scope="session")
def tiny_tr(tiny, tiny_tok) -> Transcriber:
    return Transcriber(tiny, tiny_tok)


@pytest.fixture(scope="session")
def base_tr(base, base_tok) -> Transcriber:
    return Transcriber(base, base_tok)


@pytest.fixture(scope="session")
def vad() -> SileroVad:
    """Silero VAD from `make test-models` (stateless: each stream passes its own state)."""
    path = MODELS_DIR / VAD_FILE
    if not path.is_file():
        not_built(path)
    return SileroVad.load(path)


def _with_vad(sessions: WhisperSessions, tok: Tokenizer, vad: SileroVad) -> Transcriber:
    return Transcriber(sessions, tok, vad=vad)


@pytest.fixture(scope="session")
def tiny_vad_tr(tiny, tiny_tok, vad) -> Transcriber:
    return _with_vad(tiny, tiny_tok, vad)


@pytest.fixture(scope="session")
def base_vad_tr(base, base_tok, vad) -> Transcriber:
    return _with_vad(base, base_tok, vad)
