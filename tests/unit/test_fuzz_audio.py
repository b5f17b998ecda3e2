"""Property tests (hypothesis) for app.engine.audio: whatever bytes arrive, decoding either gives
f32 mono 16 kHz samples that are all finite, or raises `AudioDecodeError` — never another
exception, and never more audio than the duration limit allows.

Inputs: random bytes; small valid files (WAV in several encodings, rates and channel counts,
FLAC, OGG, AIFF, and the containers FFmpeg decodes: M4A, MP4, WebM, MPEG, Matroska, with and
without a video track) that are then truncated, have bytes overwritten, or have their RIFF header
fields (chunk sizes, sample rate, channels, bits per sample) replaced by arbitrary values; and raw
PCM of any length for the streaming converter. `FUZZ_EXAMPLES=5000` searches deeper.
"""

from __future__ import annotations

import io
import os
import struct

import numpy as np
import pytest
import soundfile as sf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.engine.audio import AudioDecodeError, AudioTooLongError, decode_audio, pcm_to_float
from tests.media import CONTAINERS, encode_container

# libsndfile sometimes asks to seek before the start of a cut-off file; soundfile's callback
# raises, cffi reports it as "unraisable" and libsndfile gets an error code: not our concern.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

MAX_DURATION_S = 120.0  # the service always passes a limit (STT_MAX_AUDIO_S)
FUZZ = settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "150")),  # more for a deeper search
    deadline=None,  # decode time depends on the input and on the machine's load
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# offsets of the fields of a canonical 44-byte WAV header (RIFF/fmt /data), with their widths
WAV_HEADER_FIELDS = {
    "riff_size": (4, "<I"),
    "fmt_size": (16, "<I"),
    "format_tag": (20, "<H"),
    "channels": (22, "<H"),
    "sample_rate": (24, "<I"),
    "byte_rate": (28, "<I"),
    "block_align": (32, "<H"),
    "bits_per_sample": (34, "<H"),
    "data_size": (40, "<I"),
}


def assert_decoded_or_refused(data: bytes, max_duration_s: float | None = MAX_DURATION_S) -> None:
    """The contract: finite f32 [N] at 16 kHz within the limit, or AudioDecodeError."""
    try:
        audio = decode_audio(data, max_duration_s=max_duration_s)
    except AudioDecodeError as e:
        assert str(e), "an AudioDecodeError needs a message a person can act on"
        return
    assert audio.dtype == np.float32 and audio.ndim == 1 and audio.size > 0
    assert np.isfinite(audio).all()
    if max_duration_s is not None:
        assert audio.size <= max_duration_s * 16000 + 16, audio.size  # resampler rounding


def sine_file(fmt: str, subtype: str, rate: int, channels: int, seconds: float) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    tone = 0.3 * np.sin(2 * np.pi * 440.0 * t).astype(np.float32)
    buffer = io.BytesIO()
    sf.write(buffer, np.repeat(tone[:, None], channels, axis=1), rate, format=fmt, subtype=subtype)
    return buffer.getvalue()


VALID_FILES = st.builds(
    sine_file,
    st.just("WAV"),
    st.sampled_from(["PCM_16", "PCM_U8", "PCM_24", "PCM_32", "FLOAT", "DOUBLE", "ULAW", "ALAW"]),
    st.sampled_from([8000, 16000, 22050, 44100, 48000]),
    st.integers(1, 6),
    st.floats(0.01, 0.5),
) | st.sampled_from(
    [("FLAC", "PCM_16"), ("OGG", "VORBIS"), ("OGG", "OPUS"), ("AIFF", "PCM_16"),
     ("MP3", "MPEG_LAYER_III")]
).flatmap(
    lambda kind: st.builds(
        sine_file, st.just(kind[0]), st.just(kind[1]), st.sampled_from([16000, 48000]),
        st.integers(1, 2), st.floats(0.05, 0.5),
    )
)  # fmt: skip


def container_file(kind: str, rate: int, channels: int, seconds: float, video: bool) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    tone = (0.3 * np.sin(2 * np.pi * 440.0 * t)).astype(np.float32)
    return encode_container(tone, rate, kind, channels=channels, video=video)


CONTAINER_FILES = st.builds(
    container_file,
    st.sampled_from(sorted(CONTAINERS)),
    st.sampled_from([8000, 16000, 44100, 48000]),
    st.integers(1, 2),
    st.floats(0.05, 0.6),
    st.booleans(),
)
VALID_FILES = VALID_FILES | CONTAINER_FILES


@FUZZ
@given(st.binary(max_size=4096))
def test_random_bytes(data: bytes) -> None:
    assert_decoded_or_refused(data)
    assert_decoded_or_refused(data, max_duration_s=None)


@FUZZ
@given(
    st.binary(min_size=0, max_size=2048),
    st.sampled_from(
        [
            b"RIFF",
            b"fLaC",
            b"OggS",
            b"FORM",
            b"\x00\x00\x00\x20ftypM4A ",
            b"\x1a\x45\xdf\xa3",
            b"\x00\x00\x01\xba",
            b"ID3\x04",
            b"\xff\xf1",
        ]
    ),
)
def test_random_bytes_behind_a_real_magic_number(tail: bytes, magic: bytes) -> None:
    """Libraries pick the parser from the first bytes: garbage behind each magic number."""
    data = magic + (struct.pack("<I", len(tail)) + b"WAVE" if magic == b"RIFF" else b"") + tail
    assert_decoded_or_refused(data)


@FUZZ
@given(VALID_FILES, st.data())
def test_truncated_files(data: bytes, draw: st.DataObject) -> None:
    keep = draw.draw(st.integers(0, len(data)), label="keep")
    assert_decoded_or_refused(data[:keep])


@FUZZ
@given(VALID_FILES, st.data())
def test_corrupted_bytes(data: bytes, draw: st.DataObject) -> None:
    corrupted = bytearray(data)
    for _ in range(draw.draw(st.integers(1, 16), label="flips")):
        position = draw.draw(st.integers(0, len(corrupted) - 1), label="position")
        corrupted[position] = draw.draw(st.integers(0, 255), label="byte")
    assert_decoded_or_refused(bytes(corrupted))


@FUZZ
@given(
    st.sampled_from(["PCM_16", "PCM_24", "PCM_U8"]),
    st.integers(1, 2),  # canonical 44-byte header (more channels: WAVE_FORMAT_EXTENSIBLE)
    st.dictionaries(
        st.sampled_from(sorted(WAV_HEADER_FIELDS)),
        st.sampled_from([0, 1, 2, 3, 7, 255, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF])
        | st.integers(0, 2**16),
        min_size=1,
    ),
)
def test_hostile_wav_header_fields(subtype: str, channels: int, fields: dict[str, int]) -> None:
    """Sizes and rates in the header that lie (4 GB chunks, 1 Hz, 65535 channels, 0 bits...)."""
    data = bytearray(sine_file("WAV", subtype, 16000, channels, 0.2))
    assert data[36:40] == b"data", "not the canonical header layout"
    for name, value in fields.items():
        offset, fmt = WAV_HEADER_FIELDS[name]
        struct.pack_into(fmt, data, offset, value & (0xFFFF if fmt == "<H" else 0xFFFFFFFF))
    assert_decoded_or_refused(bytes(data))


def test_header_announcing_hours_is_refused_before_decoding() -> None:
    """A 44-byte header that announces 2 h of 8 kHz audio: too long, without reading data."""
    data = bytearray(sine_file("WAV", "PCM_16", 8000, 1, 0.1))
    two_hours = 2 * 3600 * 8000 * 2
    struct.pack_into("<I", data, 40, two_hours)
    struct.pack_into("<I", data, 4, two_hours + 36)
    data += bytes(2 * 8000 * 200)  # 200 s actually present: more than the limit, less than 2 h
    with pytest.raises(AudioTooLongError, match="limit is 120 s"):
        decode_audio(bytes(data), max_duration_s=MAX_DURATION_S)


@FUZZ
@given(st.binary(max_size=999), st.sampled_from(["pcm_s16le", "pcm_f32le"]))
def test_pcm_chunks(data: bytes, encoding: str) -> None:
    width = 2 if encoding == "pcm_s16le" else 4
    try:
        audio = pcm_to_float(data, encoding)  # type: ignore[arg-type]
    except AudioDecodeError as e:
        assert len(data) % width or encoding == "pcm_f32le", e
        return
    assert audio.dtype == np.float32 and audio.shape == (len(data) // width,)
    assert np.isfinite(audio).all()
    if encoding == "pcm_s16le":
        assert np.all(np.abs(audio) <= 1.0)
