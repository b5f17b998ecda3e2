"""app.engine.mel against the oracles: librosa's filterbank and transformers' feature extractor."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from app.engine.audio import decode_audio
from app.engine.mel import (
    HOP_LENGTH,
    N_FFT,
    log_mel_spectrogram,
    mel_filters,
    pad_or_trim,
)
from app.runtime.contract import N_FRAMES, N_SAMPLES_PER_WINDOW
from tests.conftest import AUDIO

CLIPS = ["jfk.wav", "1089-134686-0000.flac", "earnings22_1_4482311_3_62.wav"]
TOLERANCE = 1e-4
# float32 STFT against the float64 reference formula (measured: <= 6.5e-6 on these clips)
REFERENCE_TOLERANCE = 2e-5


@pytest.fixture(scope="module")
def clips() -> dict[str, np.ndarray]:
    return {name: decode_audio(AUDIO / name) for name in CLIPS}


@pytest.fixture(scope="module")
def extractors():
    transformers = pytest.importorskip("transformers")
    return {n: transformers.WhisperFeatureExtractor(feature_size=n) for n in (80, 128)}


@pytest.mark.parametrize("n_mels", [80, 128])
def test_filters_equal_librosa(n_mels: int) -> None:
    librosa_filters = pytest.importorskip("librosa.filters")
    ours = mel_filters(n_mels)
    theirs = librosa_filters.mel(sr=16000, n_fft=N_FFT, n_mels=n_mels)
    assert ours.shape == theirs.shape == (n_mels, N_FFT // 2 + 1)
    assert ours.dtype == np.float32
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-8)
    assert mel_filters(n_mels) is ours  # cached
    assert not ours.flags.writeable


@pytest.mark.parametrize("n_mels", [80, 128])
@pytest.mark.parametrize("name", CLIPS)
def test_equals_transformers_numpy_path(clips, extractors, name: str, n_mels: int) -> None:
    audio = clips[name]
    ours = log_mel_spectrogram(audio, n_mels=n_mels)
    theirs = extractors[n_mels]._np_extract_fbank_features(audio[None], "cpu")[0]
    assert ours.dtype == np.float32
    assert ours.shape == theirs.shape == (n_mels, audio.shape[0] // HOP_LENGTH)
    diff = float(np.abs(ours - theirs).max())
    assert diff < REFERENCE_TOLERANCE, f"{name} n_mels={n_mels}: max abs diff {diff:.2e}"


@pytest.mark.parametrize("name", CLIPS)
def test_equals_transformers_torch_path(clips, extractors, name: str) -> None:
    # the torch path is openai/whisper's own computation (torch.stft, float32)
    pytest.importorskip("torch")
    audio = clips[name]
    ours = log_mel_spectrogram(audio)
    theirs = extractors[80]._torch_extract_fbank_features(audio[None], "cpu")[0]
    assert ours.shape == theirs.shape
    assert float(np.abs(ours - theirs).max()) < TOLERANCE


def test_first_window_as_whisper_feeds_the_encoder(clips, extractors) -> None:
    # openai/whisper: mel of the audio + 30 s of silence, first 3000 frames; transformers: the
    # audio padded to 30 s. Both give the encoder's input [n_mels, 3000].
    audio = clips["jfk.wav"]
    ours = pad_or_trim(log_mel_spectrogram(audio, padding=N_SAMPLES_PER_WINDOW))
    theirs = extractors[80](audio, sampling_rate=16000, return_tensors="np").input_features[0]
    assert ours.shape == theirs.shape == (80, N_FRAMES)
    assert float(np.abs(ours - theirs).max()) < TOLERANCE


@pytest.mark.parametrize(("samples", "padding"), [(0, 0), (159, 0), (160, 0), (1000, 0), (0, 320)])
def test_frame_count(samples: int, padding: int) -> None:
    audio = np.random.default_rng(0).normal(0, 0.1, samples).astype(np.float32)
    mel = log_mel_spectrogram(audio, padding=padding)
    assert mel.shape == (80, (samples + padding) // HOP_LENGTH)


@pytest.mark.parametrize("samples", [16000, 16123])
@pytest.mark.parametrize("padding", [1, 160, 200, 201, 359, 360, 4000, N_SAMPLES_PER_WINDOW])
def test_padding_equals_appended_silence(samples: int, padding: int) -> None:
    # the frames that see only the padding are not transformed: the result must be the full
    # transform of the audio with the zeros appended (to the last bit but one: the filterbank's
    # matmul over fewer frames may round differently)
    audio = np.random.default_rng(2).normal(0, 0.1, samples).astype(np.float32)
    padded = log_mel_spectrogram(audio, padding=padding)
    appended = log_mel_spectrogram(np.concatenate([audio, np.zeros(padding, np.float32)]))
    np.testing.assert_allclose(padded, appended, rtol=0, atol=2.5e-7)


def test_silence_is_the_floor() -> None:
    mel = log_mel_spectrogram(np.zeros(16000, dtype=np.float32))
    np.testing.assert_array_equal(mel, np.full((80, 100), -1.5, dtype=np.float32))


def test_floor_is_eight_below_the_clip_max() -> None:
    rng = np.random.default_rng(1)
    audio = np.concatenate([rng.normal(0, 0.3, 8000), np.zeros(8000)]).astype(np.float32)
    mel = log_mel_spectrogram(audio)
    assert mel.max() - mel.min() == pytest.approx(2.0, abs=1e-6)  # 8 log10 units / 4


def test_tone_lands_in_its_band() -> None:
    t = np.arange(16000) / 16000
    mel = log_mel_spectrogram((0.5 * np.sin(2 * np.pi * 1000 * t)).astype(np.float32))
    fft_bin = round(1000 * N_FFT / 16000)  # 25
    assert mel[:, 10:-10].mean(axis=1).argmax() == mel_filters(80)[:, fft_bin].argmax()


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="1-D"):
        log_mel_spectrogram(np.zeros((2, 16000), dtype=np.float32))
    with pytest.raises(ValueError, match="padding"):
        log_mel_spectrogram(np.zeros(16000, dtype=np.float32), padding=-1)


def test_pad_or_trim() -> None:
    mel = np.arange(80 * 10, dtype=np.float32).reshape(80, 10)
    padded = pad_or_trim(mel)
    assert padded.shape == (80, N_FRAMES)
    np.testing.assert_array_equal(padded[:, :10], mel)
    assert not padded[:, 10:].any()
    trimmed = pad_or_trim(mel, 4)
    np.testing.assert_array_equal(trimmed, mel[:, :4])
    assert pad_or_trim(mel, 10) is mel
    assert pad_or_trim(mel, 3, axis=0).shape == (3, 10)
    assert pad_or_trim(np.ones(5), 8).tolist() == [1, 1, 1, 1, 1, 0, 0, 0]


def test_first_calls_need_no_librosa_numba_or_torch() -> None:
    """The filters are computed in numpy: serving never imports the heavy test-only packages
    (their import alone takes seconds). The mel's time is a column of `benchmarks/speed.py`."""
    code = (
        "import sys\n"
        "import numpy as np\n"
        "from app.engine.mel import log_mel_spectrogram\n"
        "mel = log_mel_spectrogram(np.zeros(480000, np.float32), 128)\n"
        "mel = log_mel_spectrogram(np.zeros(480000, np.float32))\n"
        "print(sorted(m for m in ('librosa', 'numba', 'torch', 'scipy') if m in sys.modules))\n"
    )
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
