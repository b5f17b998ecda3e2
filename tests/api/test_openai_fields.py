"""OpenAI's `keywords[]` and `languages[]`, sent by the official `openai` SDK to the live server."""

from __future__ import annotations

import io
import re
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
import soundfile as sf

from tests.api.conftest import JFK_WAV, LiveServer
from tests.conftest import AUDIO

pytestmark = pytest.mark.timeout(300)

FILLERS = re.compile(r"\b(um|uh|hmm)\b", re.IGNORECASE)


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url("/v1"), api_key="unused", max_retries=0, timeout=180)


def test_a_candidate_language_the_model_cannot_do_is_a_400(client: openai.OpenAI) -> None:
    with JFK_WAV.open("rb") as f, pytest.raises(openai.BadRequestError) as e:
        client.audio.transcriptions.create(model="tiny.en", file=f, languages=["en", "de"])
    assert e.value.body["param"] == "languages[]"
    assert "English-only" in e.value.body["message"]


def test_keywords_guide_the_transcription_as_hotwords(client: openai.OpenAI) -> None:
    """tiny.en leaves out the earnings call's fillers (20 s) unless its prompt has them."""
    audio, rate = sf.read(AUDIO / "earnings22_1_4482311_3_62.wav", dtype="float32")
    wav = io.BytesIO()
    sf.write(wav, audio[: 20 * rate], rate, format="WAV")
    texts = [
        client.audio.transcriptions.create(
            model="tiny.en", file=("call.wav", wav.getvalue()), response_format="text", **extra
        )
        for extra in ({}, {"keywords": ["Um", "uh", "hmm."]})
    ]
    assert [bool(FILLERS.search(text)) for text in texts] == [False, True], texts


@pytest.fixture
def base(server: LiveServer) -> Iterator[str]:
    """The multilingual base, loaded for the test and unloaded after it."""
    deadline = time.monotonic() + 180
    while httpx.post(server.url("/v1/models/base"), timeout=10).status_code != 200:
        assert time.monotonic() < deadline, server.log_tail()
        time.sleep(0.5)
    yield "base"
    httpx.delete(server.url("/v1/models/base"), timeout=10)


def test_languages_restrict_detection_to_the_candidates(client: openai.OpenAI, base: str) -> None:
    with JFK_WAV.open("rb") as f:
        result = client.audio.transcriptions.create(
            model=base, file=f, response_format="verbose_json", languages=["de", "French"]
        )
    assert result.language in ("german", "french")
