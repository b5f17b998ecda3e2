"""Hostile uploads through the live server: every file gets a clear status with OpenAI's error
shape, or a correct transcript; afterwards the server is healthy and idle and still transcribes.

Complements test_errors.py (form fields, unknown models, a few undecodable payloads) with the
files a careless or hostile client sends: cut-off, lying headers, wrong names, no samples, NaN,
unusual rates and channel counts, and two hours of audio in a small file.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import numpy as np
import pytest
import soundfile as sf
import soxr

from tests.api.conftest import JFK_TEXT, JFK_WAV, LiveServer, assert_openai_error, normalise

pytestmark = pytest.mark.timeout(300)

TRANSCRIBE = "/v1/audio/transcriptions"
JFK_START = "and so my fellow americans"


def jfk_audio() -> tuple[np.ndarray, int]:
    """jfk.wav as f32 [N] and its rate (16 kHz)."""
    audio, rate = sf.read(str(JFK_WAV), dtype="float32")
    return audio, rate


def encoded(audio: np.ndarray, rate: int, fmt: str = "WAV", subtype: str = "PCM_16") -> bytes:
    """f32 [N] or [N, C] -> the bytes of a file."""
    buffer = io.BytesIO()
    sf.write(buffer, audio, rate, format=fmt, subtype=subtype)
    return buffer.getvalue()


def jfk_at(rate: int) -> bytes:
    audio, source_rate = jfk_audio()
    return encoded(soxr.resample(audio, source_rate, rate), rate)


def jfk_six_channels() -> bytes:
    """5.1: the speech on the centre channel and quieter copies on the others."""
    audio, rate = jfk_audio()
    gains = np.array([0.3, 0.3, 1.0, 0.1, 0.2, 0.2], np.float32)
    return encoded(audio[:, None] * gains[None, :], rate)


def lying_riff_sizes() -> bytes:
    """jfk.wav with RIFF and data chunk sizes of 4 GB (0xFFFFFFFF); the samples are intact."""
    data = bytearray(JFK_WAV.read_bytes())
    struct.pack_into("<I", data, 4, 0xFFFFFFFF)
    data_chunk = data.index(b"data", 12)
    struct.pack_into("<I", data, data_chunk + 4, 0xFFFFFFFF)
    return bytes(data)


def truncated_jfk(seconds: float) -> bytes:
    """jfk.wav cut off after `seconds` of samples (the header still announces 11 s)."""
    data = JFK_WAV.read_bytes()
    data_start = data.index(b"data", 12) + 8
    return data[: data_start + int(seconds * 16000) * 2 + 1]


def two_hours_of_flac() -> bytes:
    """Two hours of 8 kHz silence as FLAC (~180 kB), written a minute at a time."""
    buffer = io.BytesIO()
    minute = np.zeros(8000 * 60, np.int16)
    with sf.SoundFile(buffer, "w", 8000, 1, format="FLAC", subtype="PCM_16") as f:
        for _ in range(120):
            f.write(minute)
    return buffer.getvalue()


def two_hours_at_1khz() -> bytes:
    """A real 2 h WAV in 7.2 MB: 1 kHz, 8-bit (within the 25 MB upload limit)."""
    return encoded(np.zeros(1000 * 7200, np.float32), 1000, subtype="PCM_U8")


@dataclass(frozen=True)
class Upload:
    """A file to send and what must come back: a status (+ error code), or text."""

    filename: str
    make: Callable[[], bytes]
    status: int
    code: str | None = None  # the error's code when status != 200
    text_starts: str | None = None  # normalised transcript prefix when status == 200


UPLOADS = {
    "empty": Upload("a.wav", lambda: b"", 400, "empty_file"),
    "random-bytes": Upload(
        "a.wav", lambda: np.random.default_rng(1).bytes(64 * 1024), 415, "unsupported_audio"
    ),
    "header-only-cut": Upload("a.wav", lambda: JFK_WAV.read_bytes()[:30], 415, "unsupported_audio"),
    "truncated-wav": Upload("a.wav", lambda: truncated_jfk(4.5), 200, text_starts=JFK_START),
    "huge-riff-sizes": Upload("a.wav", lying_riff_sizes, 200, text_starts=normalise(JFK_TEXT)),
    "wav-named-mp3": Upload("speech.mp3", JFK_WAV.read_bytes, 200, text_starts=normalise(JFK_TEXT)),
    "text-named-wav": Upload(
        "speech.wav", lambda: b"I am a text file, not audio.\n" * 40, 415, "unsupported_audio"
    ),
    "zero-duration-wav": Upload(
        "a.wav", lambda: encoded(np.zeros(0, np.float32), 16000), 415, "unsupported_audio"
    ),
    "nan-float-wav": Upload(
        "a.wav",
        lambda: encoded(np.full(16000, np.nan, np.float32), 16000, subtype="FLOAT"),
        415,
        "unsupported_audio",
    ),
    # 8 kHz keeps nothing above 4 kHz, where the final /s/ of "Americans" lives: tiny.en hears
    # "America" or "Americans" depending on a 32 ms shift of the VAD's cut (both measured)
    "8khz": Upload("a.wav", lambda: jfk_at(8000), 200, text_starts="and so my fellow america"),
    "48khz": Upload("a.wav", lambda: jfk_at(48000), 200, text_starts=normalise(JFK_TEXT)),
    "6-channels": Upload("a.wav", jfk_six_channels, 200, text_starts=normalise(JFK_TEXT)),
    "2h-flac": Upload("long.flac", two_hours_of_flac, 413, "audio_too_long"),
    "2h-wav-1khz": Upload("long.wav", two_hours_at_1khz, 413, "audio_too_long"),
}


@pytest.fixture(scope="module")
def http(server: LiveServer) -> httpx.Client:
    with httpx.Client(base_url=server.base_url, timeout=120) as client:
        yield client


@pytest.mark.parametrize("name", list(UPLOADS))
def test_hostile_upload(http: httpx.Client, name: str) -> None:
    upload = UPLOADS[name]
    r = http.post(
        TRANSCRIBE,
        data={"model": "tiny.en"},  # server defaults (beam 5)
        files={"file": (upload.filename, upload.make(), "application/octet-stream")},
    )
    if upload.status == 200:
        assert r.status_code == 200, r.text
        assert normalise(r.json()["text"]).startswith(upload.text_starts), r.json()["text"]
        return
    error = assert_openai_error(r, upload.status, param="file")
    assert error["code"] == upload.code, error
    if upload.status == 413:
        assert "7200" in error["message"] and "3600" in error["message"], error


def test_server_is_fine_after_the_barrage(http: httpx.Client) -> None:
    """Every hostile upload once more, back to back, then /health and a normal request."""
    for upload in UPLOADS.values():
        http.post(TRANSCRIBE, files={"file": (upload.filename, upload.make())})
    health = http.get("/health")
    assert health.status_code == 200
    assert health.json()["status"] == "ready"
    assert health.json()["active"] == 0 and health.json()["queued"] == 0
    r = http.post(TRANSCRIBE, data={"model": "tiny.en"}, files={"file": JFK_WAV.open("rb")})
    assert r.status_code == 200, r.text
    assert normalise(r.json()["text"]) == normalise(JFK_TEXT)
