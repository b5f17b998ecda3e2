"""OpenAI's `keywords[]` and `languages[]`, sent by the official `openai` SDK to the live server."""

from __future__ import annotations

import io
import re

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


def test_languages_restrict_detection_to_the_candidates(client: openai.OpenAI, base: str) -> None:
    with JFK_WAV.open("rb") as f:
        result = client.audio.transcriptions.create(
            model=base, file=f, response_format="verbose_json", languages=["de", "French"]
        )
    assert result.language in ("german", "french")
    with JFK_WAV.open("rb") as f:  # json names the language read in, as OpenAI's `languages`
        picked = client.audio.transcriptions.create(model=base, file=f, languages=["de", "fr"])
    code = {"german": "de", "french": "fr"}[result.language]
    assert [lang.code for lang in picked.languages or []] == [code]


def test_json_and_the_streams_end_name_the_language_the_text_was_read_in(
    client: openai.OpenAI,
) -> None:
    with JFK_WAV.open("rb") as f:
        result = client.audio.transcriptions.create(model="tiny.en", file=f)
    assert [lang.code for lang in result.languages or []] == ["en"]
    with JFK_WAV.open("rb") as f:
        events = list(client.audio.transcriptions.create(model="tiny.en", file=f, stream=True))
    done = events[-1]
    assert done.type == "transcript.text.done"
    assert [lang.code for lang in done.languages or []] == ["en"]
