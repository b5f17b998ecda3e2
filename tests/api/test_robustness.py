"""Trustworthy transcripts through the live server and the official openai SDK, default settings:
quiet speech is transcribed, noise and music give no text, the containers phones and browsers
record in are accepted, broken or over-long ones get 415 / 413 with a message a person reads.
"""

from __future__ import annotations

import asyncio
import io

import numpy as np
import openai
import pytest
import soundfile as sf

from app.engine.audio import decode_audio
from tests.api.conftest import (
    JFK_TEXT,
    JFK_WAV,
    STRICT_KEY,
    LiveServer,
    assert_openai_error,
    normalise,
)
from tests.api.test_stream_ws import stream_audio, ws_url
from tests.media import RATE, chords, clatter, coloured, db, drums, encode_container

pytestmark = pytest.mark.timeout(300)

TRANSCRIBE = "/v1/audio/transcriptions"
NOISE_S = 12.0


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url("/v1"), api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def jfk() -> np.ndarray:
    return decode_audio(JFK_WAV)


def wav_bytes(audio: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, np.asarray(audio, np.float32), RATE, format="WAV", subtype="FLOAT")
    return buffer.getvalue()


def nonspeech() -> dict[str, np.ndarray]:
    """Seeded non-speech clips (the robustness corpus has the full set)."""
    rng = np.random.default_rng(7)
    n = int(NOISE_S * RATE)
    return {
        "pink noise": db(-20) * coloured(rng, n, 1.0),
        "brown noise": db(-20) * coloured(rng, n, 2.0),
        "kitchen clatter": clatter(rng, n),
        "music chords": chords(n),
        "music drums": drums(rng, n),
        "digital silence": np.zeros(n),
    }


NONSPEECH = nonspeech()


def transcribe(client: openai.OpenAI, name: str, data: bytes, **extra: object) -> str:
    result = client.audio.transcriptions.create(
        model="tiny.en", file=(name, data), extra_body=extra or None
    )
    return result.text


@pytest.mark.parametrize("gain_db", [-30, -50])
def test_quiet_speech_is_transcribed(client: openai.OpenAI, jfk: np.ndarray, gain_db: int) -> None:
    """jfk 50 dB down (peaks near -52 dBFS): the same words as at its own level."""
    text = transcribe(client, "quiet.wav", wav_bytes(jfk * db(gain_db)))
    assert normalise(text) == normalise(JFK_TEXT)


@pytest.mark.parametrize("kind", ["m4a", "webm", "mp4"])
def test_phone_and_browser_containers(client: openai.OpenAI, jfk: np.ndarray, kind: str) -> None:
    data = encode_container(jfk, RATE, kind, video=kind == "mp4")  # mp4: a screen recording
    assert normalise(transcribe(client, f"jfk.{kind}", data)) == normalise(JFK_TEXT)


@pytest.mark.parametrize("name", sorted(NONSPEECH))
@pytest.mark.parametrize("beam_size", [1, 5])
def test_nonspeech_gives_no_text(client: openai.OpenAI, name: str, beam_size: int) -> None:
    text = transcribe(client, "noise.wav", wav_bytes(NONSPEECH[name]), beam_size=beam_size)
    assert text == "", text


def test_nonspeech_over_sse_sends_no_delta(client: openai.OpenAI) -> None:
    stream = client.audio.transcriptions.create(
        model="tiny.en", file=("noise.wav", wav_bytes(NONSPEECH["kitchen clatter"])), stream=True
    )
    events = list(stream)
    assert [e.type for e in events] == ["transcript.text.done"], events
    assert events[-1].text == ""


def test_defences_can_be_turned_off_per_request(client: openai.OpenAI) -> None:
    """The same music clip, all defences off: Whisper writes text over it, which is what the
    defaults keep out (and shows the request fields reach the decoder)."""
    data = wav_bytes(NONSPEECH["music chords"])
    off = {"vad_filter": False, "no_speech_threshold": 1.0, "repetition_guard": False}
    assert transcribe(client, "music.wav", data, **off) != ""
    assert transcribe(client, "music.wav", data) == ""


def test_corrupt_m4a_is_415(server: LiveServer, jfk: np.ndarray) -> None:
    import httpx

    data = encode_container(jfk, RATE, "m4a")
    r = httpx.post(
        server.url(TRANSCRIBE),
        files={"file": ("cut.m4a", data[: len(data) // 2], "audio/mp4")},
        data={"model": "tiny.en"},
        timeout=60,
    )
    error = assert_openai_error(r, 415, param="file")
    assert "MP4/M4A" in error["message"] and "corrupt or truncated" in error["message"]


def test_overlong_m4a_is_413(strict_server: LiveServer) -> None:
    """100 s of audio in a small m4a, against the strict server's 90 s limit."""
    import httpx

    data = encode_container(np.zeros(100 * RATE, np.float32), RATE, "m4a")
    assert len(data) < 3 * 2**20
    r = httpx.post(
        strict_server.url(TRANSCRIBE),
        headers={"Authorization": f"Bearer {STRICT_KEY}"},
        files={"file": ("long.m4a", data, "audio/mp4")},
        data={"model": "tiny.en"},
        timeout=60,
    )
    error = assert_openai_error(r, 413, param="file")
    assert error["code"] == "audio_too_long" and "90" in error["message"]


@pytest.mark.parametrize("name", ["pink noise", "music drums", "kitchen clatter"])
def test_websocket_fed_noise_writes_nothing(server: LiveServer, name: str) -> None:
    pcm = (np.clip(NONSPEECH[name], -1, 1) * 32767).astype("<i2").tobytes()
    run = asyncio.run(stream_audio(ws_url(server), pcm, chunk_s=0.2, speed=4.0))
    assert run.close_code == 1000
    assert not run.of("transcript.text.delta"), run.of("transcript.text.delta")
    assert not [p for p in run.of("transcript.text.partial") if p["text"].strip()]
    assert run.done_text == ""
