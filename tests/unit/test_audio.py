"""app.engine.audio: decoding files and raw PCM to f32 mono 16 kHz, and its error messages."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from app.engine.audio import (
    MAX_LIFT,
    PEAK_QUANTILE,
    QUIET_PEAK,
    AudioDecodeError,
    AudioTooLongError,
    decode_audio,
    is_narrowband,
    lift_quiet,
    pcm_to_float,
    resample,
)
from tests.conftest import AUDIO
from tests.media import peak_hz, telephone, tone


@pytest.fixture(scope="module")
def audio_dir() -> Path:
    return AUDIO


@pytest.fixture(scope="module")
def jfk(audio_dir: Path) -> np.ndarray:
    return decode_audio(audio_dir / "jfk.wav")


def encode(data: np.ndarray, rate: int, fmt: str = "WAV", subtype: str | None = None) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, data, rate, format=fmt, subtype=subtype)
    return buf.getvalue()


def rms(audio: np.ndarray) -> float:
    return float(np.sqrt(np.mean(audio.astype(np.float64) ** 2)))


# --- real clips ---------------------------------------------------------------------------


def test_wav_16k_is_read_exactly(audio_dir: Path, jfk: np.ndarray) -> None:
    raw, rate = sf.read(audio_dir / "jfk.wav", dtype="int16")
    assert rate == 16000
    assert jfk.dtype == np.float32 and jfk.ndim == 1 and jfk.flags.c_contiguous
    assert jfk.shape == (176000,)
    np.testing.assert_array_equal(jfk, raw.astype(np.float32) / 32768)


@pytest.mark.parametrize("name", ["jfk.flac", "jfk.mp3"])
def test_other_encodings_of_the_same_clip_agree(
    audio_dir: Path, jfk: np.ndarray, name: str
) -> None:
    # jfk.flac is 44.1 kHz stereo (downmix + resample); jfk.mp3 is 16 kHz mono MP3 (mpg123)
    audio = decode_audio(audio_dir / name)
    assert audio.dtype == np.float32 and audio.ndim == 1
    assert audio.shape == jfk.shape
    assert np.corrcoef(audio, jfk)[0, 1] > 0.999


def test_24k_clip_is_resampled(audio_dir: Path) -> None:
    path = audio_dir / "earnings22_1_4482311_3_62.wav"
    info = sf.info(path)
    assert info.samplerate == 24000
    audio = decode_audio(path)
    assert abs(audio.shape[0] - round(info.frames * 16000 / 24000)) <= 1


def test_sources_bytes_path_str_and_files_give_the_same_samples(
    audio_dir: Path, jfk: np.ndarray
) -> None:
    path = audio_dir / "jfk.wav"
    data = path.read_bytes()
    np.testing.assert_array_equal(decode_audio(data), jfk)
    np.testing.assert_array_equal(decode_audio(bytearray(data)), jfk)
    np.testing.assert_array_equal(decode_audio(memoryview(data)), jfk)
    np.testing.assert_array_equal(decode_audio(str(path)), jfk)
    with open(path, "rb") as f:
        np.testing.assert_array_equal(decode_audio(f), jfk)
        assert not f.closed  # the caller's file stays open

    class Stream(io.RawIOBase):  # a non-seekable stream, like a socket
        def __init__(self) -> None:
            self._buf = io.BytesIO(data)

        def readable(self) -> bool:
            return True

        def readinto(self, b) -> int:  # type: ignore[override]
            return self._buf.readinto(b)

    np.testing.assert_array_equal(decode_audio(Stream()), jfk)


def test_other_target_rate(jfk: np.ndarray, audio_dir: Path) -> None:
    audio = decode_audio(audio_dir / "jfk.wav", sampling_rate=8000)
    assert audio.shape == (88000,)


# --- synthetic files: rates, channels, formats --------------------------------------------


@pytest.mark.parametrize("rate", [8000, 11025, 22050, 44100, 48000])
def test_any_rate_is_resampled_to_16k(rate: int) -> None:
    audio = decode_audio(encode(tone(2.0, rate), rate))
    assert abs(audio.shape[0] - 32000) <= 1
    assert abs(peak_hz(audio) - 440) < 1
    assert rms(audio[1000:-1000]) == pytest.approx(0.5 / np.sqrt(2), rel=0.01)


def test_stereo_is_averaged() -> None:
    left = tone(1.0, 48000, amp=0.8)
    stereo = np.stack([left, np.zeros_like(left)], axis=1)  # [N, 2]
    audio = decode_audio(encode(stereo, 48000))
    assert audio.shape == (16000,)
    assert rms(audio[500:-500]) == pytest.approx(0.4 / np.sqrt(2), rel=0.01)


def test_six_channels_are_averaged() -> None:
    data = np.zeros((16000, 6), dtype=np.float32)
    data[:, 2] = tone(1.0, 16000, amp=0.6)
    data[:, 5] = 0.3  # DC offset on another channel
    audio = decode_audio(encode(data, 16000))
    assert audio.shape == (16000,)
    np.testing.assert_allclose(audio, (data[:, 2] + 0.3) / 6, atol=1e-4)  # PCM_16 rounding


@pytest.mark.parametrize(
    ("fmt", "subtype"),
    [
        ("FLAC", None),
        ("OGG", "VORBIS"),
        ("OGG", "OPUS"),
        ("AIFF", None),
        ("MP3", "MPEG_LAYER_III"),
        ("WAV", "FLOAT"),
        ("WAV", "PCM_24"),
    ],
)
def test_formats(fmt: str, subtype: str | None) -> None:
    audio = decode_audio(encode(tone(1.0, 16000, freq=1000.0), 16000, fmt, subtype))
    # lossy codecs may add encoder delay/padding: allow a few frames
    assert abs(audio.shape[0] - 16000) < 2000
    assert abs(peak_hz(audio) - 1000) < 2


def test_truncated_wav_data_decodes_what_is_there(caplog: pytest.LogCaptureFixture) -> None:
    data = encode(tone(1.0, 16000), 16000, subtype="PCM_16")
    cut = data[: 44 + 2 * 8000]  # header + half of the samples
    with caplog.at_level(logging.WARNING, logger="app.engine.audio"):
        audio = decode_audio(cut)
    assert audio.shape == (8000,)
    assert "truncated" in caplog.text


# --- errors -------------------------------------------------------------------------------


def assert_clear(error: pytest.ExceptionInfo[AudioDecodeError], *words: str) -> None:
    message = str(error.value)
    assert isinstance(error.value, ValueError)
    for word in words:
        assert word in message, message
    for leak in ("BytesIO", "Error opening", "LibsndfileError"):
        assert leak not in message, message


@pytest.mark.parametrize("empty", [b"", bytearray(), io.BytesIO(b"")])
def test_empty_input(empty) -> None:
    with pytest.raises(AudioDecodeError) as e:
        decode_audio(empty)
    assert_clear(e, "empty", "0 bytes")


def test_empty_and_missing_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty.wav"
    empty.write_bytes(b"")
    with pytest.raises(AudioDecodeError) as e:
        decode_audio(empty)
    assert_clear(e, "empty")
    with pytest.raises(AudioDecodeError) as e:
        decode_audio(tmp_path / "missing.wav")
    assert_clear(e, "no such file")


@pytest.mark.parametrize(
    "data", [np.random.default_rng(0).bytes(5000), b"this is a text file, not audio\n" * 50]
)
def test_not_audio(data: bytes) -> None:
    with pytest.raises(AudioDecodeError) as e:
        decode_audio(data)
    assert_clear(e, "could not decode the audio", "not audio in a supported format", "WAV")


def test_broken_mp4_container_is_named() -> None:
    fake_m4a = b"\x00\x00\x00\x20ftypM4A \x00\x00\x02\x00" + bytes(2000)
    with pytest.raises(AudioDecodeError) as e:
        decode_audio(fake_m4a)
    assert_clear(e, "MP4/M4A", "corrupt or truncated")


@pytest.mark.parametrize("keep", [12, 20, 44])
def test_truncated_wav_header(keep: int) -> None:
    data = encode(tone(0.5, 16000), 16000)
    with pytest.raises(AudioDecodeError) as e:
        decode_audio(data[:keep])
    assert_clear(e, "could not decode the audio")


def test_truncated_header_says_truncated() -> None:
    data = encode(tone(0.5, 16000), 16000)
    with pytest.raises(AudioDecodeError) as e:
        decode_audio(data[:44])  # the header alone: it announces 8000 samples
    assert_clear(e, "truncated", "holds no samples")


def test_truncated_flac_stream() -> None:
    noise = np.random.default_rng(1).uniform(-0.5, 0.5, 48000).astype(np.float32)
    data = encode(noise, 16000, "FLAC")
    with pytest.raises(AudioDecodeError) as e:
        decode_audio(data[: len(data) // 2])
    assert_clear(e, "could not decode the audio", "truncated or corrupt")


def test_zero_length_audio() -> None:
    data = encode(np.zeros((0, 1), dtype=np.float32), 16000)
    assert len(data) > 0  # a valid header with no samples
    with pytest.raises(AudioDecodeError) as e:
        decode_audio(data)
    assert_clear(e, "no samples")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_samples(bad: float) -> None:
    samples = tone(0.5, 16000)
    samples[100] = bad
    samples[200] = bad
    with pytest.raises(AudioDecodeError) as e:
        decode_audio(encode(samples, 16000, subtype="FLOAT"))
    assert_clear(e, "2 of 8000 samples are NaN or infinite")


def test_max_duration() -> None:
    data = encode(tone(3.0, 16000), 16000)
    assert decode_audio(data, max_duration_s=3.0).shape == (48000,)
    with pytest.raises(AudioTooLongError) as e:
        decode_audio(data, max_duration_s=2.5)
    assert_clear(e, "3.0 s long", "limit is 2.5 s")


# --- resample and raw PCM -----------------------------------------------------------------


def test_resample() -> None:
    x = tone(1.0, 48000)
    y = resample(x, 48000, 16000)
    assert y.dtype == np.float32 and y.shape == (16000,)
    assert abs(peak_hz(y) - 440) < 1
    assert resample(y, 16000, 16000) is y
    assert resample(np.zeros(0, np.float32), 8000, 16000).shape == (0,)
    with pytest.raises(ValueError, match="positive"):
        resample(y, 0, 16000)


def test_pcm_s16le() -> None:
    data = np.array([0, 16384, -32768, 32767, -1], dtype="<i2").tobytes()
    audio = pcm_to_float(data, "pcm_s16le")
    assert audio.dtype == np.float32
    np.testing.assert_array_equal(audio, [0.0, 0.5, -1.0, 32767 / 32768, -1 / 32768])


def test_pcm_f32le() -> None:
    samples = np.array([0.25, -1.0, 0.999], dtype="<f4")
    audio = pcm_to_float(samples.tobytes(), "pcm_f32le")
    assert audio.dtype == np.float32 and audio.flags.writeable
    np.testing.assert_array_equal(audio, samples)
    assert pcm_to_float(b"", "pcm_f32le").shape == (0,)


@pytest.mark.parametrize(("encoding", "size"), [("pcm_s16le", 7), ("pcm_f32le", 6)])
def test_pcm_partial_sample_is_an_error(encoding: str, size: int) -> None:
    with pytest.raises(AudioDecodeError, match=f"whole number of .* got {size} bytes"):
        pcm_to_float(bytes(size), encoding)  # type: ignore[arg-type]


def test_pcm_nan_and_unknown_encoding() -> None:
    with pytest.raises(AudioDecodeError, match="NaN or infinite"):
        pcm_to_float(np.array([0.0, np.nan], dtype="<f4").tobytes(), "pcm_f32le")
    with pytest.raises(ValueError, match="unknown PCM encoding"):
        pcm_to_float(b"\x00\x00", "pcm_u8")  # type: ignore[arg-type]


# --- level -----------------------------------------------------------------------------------


def test_lift_quiet_leaves_ordinary_recordings_alone(jfk: np.ndarray) -> None:
    assert lift_quiet(jfk) is jfk
    zeros = np.zeros(16000, np.float32)
    assert lift_quiet(zeros) is zeros  # digital silence stays silence
    assert lift_quiet(np.zeros(0, np.float32)).shape == (0,)


@pytest.mark.parametrize("gain_db", [-30, -50, -60])
def test_lift_quiet_brings_quiet_speech_to_one_level(jfk: np.ndarray, gain_db: int) -> None:
    lifted = lift_quiet(jfk * np.float32(10 ** (gain_db / 20)))
    peak = float(np.quantile(np.abs(lifted), PEAK_QUANTILE))
    assert peak == pytest.approx(QUIET_PEAK, rel=1e-3)
    assert lifted.dtype == np.float32


def test_lift_quiet_is_capped() -> None:
    faint = np.full(16000, 1e-9, np.float32) * np.sign(np.sin(np.arange(16000)))
    assert float(np.max(np.abs(lift_quiet(faint)))) == pytest.approx(1e-9 * MAX_LIFT, rel=1e-3)


def test_narrowband_is_told_from_full_band() -> None:
    """A telephone line (nothing above 4.2 kHz) against the same speech recorded full band.
    (jfk.wav itself is narrowband: a 1961 broadcast.)"""
    speech = decode_audio(AUDIO / "1089-134686-0000.flac")
    phone = telephone(speech)
    assert is_narrowband(phone)
    assert not is_narrowband(speech)
    assert is_narrowband(decode_audio(AUDIO / "jfk.wav"))
    assert not is_narrowband(np.zeros(16000 * 3, np.float32))  # no power at all
    assert not is_narrowband(phone[:8000])  # under a second: not judged


def test_dc_offset_does_not_make_audio_narrowband() -> None:
    speech = decode_audio(AUDIO / "1089-134686-0000.flac")
    assert not is_narrowband(speech + np.float32(0.2))
