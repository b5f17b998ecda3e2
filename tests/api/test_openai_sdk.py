"""The official `openai` SDK against the live server, unchanged: every response format,
translations, streaming, models."""

from __future__ import annotations

import re

import openai
import pytest

from tests.api.conftest import JFK_TEXT, JFK_WAV, LONG_WAV, LiveServer, normalise
from tests.api.subtitles import parse_srt, parse_vtt
from tests.conftest import AUDIO

EMPTY_WAV = AUDIO / "picovoice_empty.wav"

pytestmark = [
    pytest.mark.timeout(300),
    # openai 3.x marks audio.translations deprecated; it is still part of the API we serve
    pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning"),
]


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url("/v1"), api_key="unused", max_retries=0, timeout=120)


def test_json_default_format(client: openai.OpenAI) -> None:
    with JFK_WAV.open("rb") as f:
        result = client.audio.transcriptions.create(model="tiny.en", file=f)
    assert isinstance(result, openai.types.audio.Transcription)
    assert normalise(result.text) == normalise(JFK_TEXT)
    assert result.text == result.text.strip()


def test_whisper_1_alias_means_default_model(client: openai.OpenAI) -> None:
    with JFK_WAV.open("rb") as f:
        result = client.audio.transcriptions.create(model="whisper-1", file=f)
    assert normalise(result.text) == normalise(JFK_TEXT)


def test_text_format(client: openai.OpenAI) -> None:
    with JFK_WAV.open("rb") as f:
        result = client.audio.transcriptions.create(model="tiny.en", file=f, response_format="text")
    assert isinstance(result, str)
    assert normalise(result) == normalise(JFK_TEXT)


def test_verbose_json(client: openai.OpenAI) -> None:
    with JFK_WAV.open("rb") as f:
        result = client.audio.transcriptions.create(
            model="tiny.en",
            file=f,
            response_format="verbose_json",
            timestamp_granularities=["segment"],
            language="en",
        )
    assert isinstance(result, openai.types.audio.TranscriptionVerbose)
    assert result.language == "english"
    assert result.duration == pytest.approx(11.0, abs=0.05)
    assert normalise(result.text) == normalise(JFK_TEXT)
    assert result.segments
    assert result.model_dump()["task"] == "transcribe"  # an extra field the SDK keeps
    previous_end = 0.0
    for i, seg in enumerate(result.segments):
        assert seg.id == i
        assert 0.0 <= seg.start < seg.end <= result.duration + 0.5
        assert seg.start >= previous_end - 1e-6
        previous_end = seg.end
        assert seg.tokens and all(isinstance(t, int) for t in seg.tokens)
        assert -5.0 < seg.avg_logprob <= 0.0
        assert 0.0 < seg.compression_ratio < 5.0
        assert 0.0 <= seg.no_speech_prob <= 1.0
        assert 0.0 <= seg.temperature <= 1.0
    assert normalise(" ".join(s.text for s in result.segments)) == normalise(result.text)


def test_srt_format_parses(client: openai.OpenAI) -> None:
    with LONG_WAV.open("rb") as f:
        result = client.audio.transcriptions.create(model="tiny.en", file=f, response_format="srt")
    assert isinstance(result, str)
    cues = parse_srt(result)
    assert len(cues) >= 3, result
    assert cues[-1].end <= 60.5
    assert "zoom" in normalise(" ".join(c.text for c in cues))


def test_vtt_format_parses(client: openai.OpenAI) -> None:
    with JFK_WAV.open("rb") as f:
        result = client.audio.transcriptions.create(model="tiny.en", file=f, response_format="vtt")
    assert isinstance(result, str)
    assert result.startswith("WEBVTT\n")
    cues = parse_vtt(result)
    assert cues and all(c.start < c.end for c in cues), result
    # the last word, "country", is spoken from 10.2 s (word timing) in an 11.0 s file
    assert 10.2 < cues[-1].end <= 11.0, result
    assert normalise(" ".join(c.text for c in cues)) == normalise(JFK_TEXT)


def test_translation_json_and_text(client: openai.OpenAI) -> None:
    # tiny.en is English-only: translating English speech into English is transcribing it.
    with JFK_WAV.open("rb") as f:
        result = client.audio.translations.create(model="tiny.en", file=f)
    assert normalise(result.text) == normalise(JFK_TEXT)
    with JFK_WAV.open("rb") as f:
        text = client.audio.translations.create(model="tiny.en", file=f, response_format="text")
    assert normalise(text) == normalise(JFK_TEXT)


def test_translation_verbose_json_and_srt(client: openai.OpenAI) -> None:
    with JFK_WAV.open("rb") as f:
        verbose = client.audio.translations.create(
            model="tiny.en", file=f, response_format="verbose_json"
        )
    assert verbose.language == "english"
    assert verbose.segments
    with JFK_WAV.open("rb") as f:
        srt = client.audio.translations.create(model="tiny.en", file=f, response_format="srt")
    assert parse_srt(srt)


def test_stream_true(client: openai.OpenAI) -> None:
    with JFK_WAV.open("rb") as f:
        stream = client.audio.transcriptions.create(model="tiny.en", file=f, stream=True)
        events = list(stream)
    types = [e.type for e in events]
    assert types[-1] == "transcript.text.done"
    assert types.count("transcript.text.done") == 1
    deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
    assert len(deltas) >= 10  # one per token, not one blob
    done = events[-1]
    assert normalise(done.text) == normalise(JFK_TEXT)
    assert normalise("".join(deltas)) == normalise(done.text)


def test_stream_async_client(server: LiveServer) -> None:
    import asyncio

    async def run() -> list[str]:
        client = openai.AsyncOpenAI(base_url=server.url("/v1"), api_key="x", max_retries=0)
        with JFK_WAV.open("rb") as f:
            stream = await client.audio.transcriptions.create(model="tiny.en", file=f, stream=True)
            types = [event.type async for event in stream]
        await client.close()
        return types

    types = asyncio.run(run())
    assert types[0] == "transcript.text.delta"
    assert types[-1] == "transcript.text.done"


def test_models_list_and_retrieve(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [m.id for m in models.data if m.loaded] == ["tiny.en"]  # type: ignore[attr-defined]
    model = client.models.retrieve("tiny.en")
    assert model.id == "tiny.en" and model.object == "model"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("large-v9")


def test_sdk_errors_are_typed(client: openai.OpenAI) -> None:
    with JFK_WAV.open("rb") as f, pytest.raises(openai.NotFoundError) as info:
        client.audio.transcriptions.create(model="no-such-model", file=f)
    assert info.value.status_code == 404
    assert info.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        client.audio.transcriptions.create(
            model="tiny.en",
            file=("x.wav", b"RIFF"),
            response_format="xml",  # type: ignore[arg-type]
        )
    assert bad.value.param == "response_format"
    with pytest.raises(openai.APIStatusError) as undecodable:
        client.audio.transcriptions.create(model="tiny.en", file=("x.wav", b"not audio" * 100))
    assert undecodable.value.status_code == 415
    assert re.search("format|decode", str(undecodable.value.message), re.IGNORECASE)


def test_vad_filter_extra(client: openai.OpenAI) -> None:
    with JFK_WAV.open("rb") as f:
        speech = client.audio.transcriptions.create(
            model="tiny.en", file=f, response_format="verbose_json", extra_body={"vad_filter": True}
        )
    assert normalise(speech.text) == normalise(JFK_TEXT)
    assert speech.segments and speech.segments[-1].end <= 11.0 + 0.05
    with EMPTY_WAV.open("rb") as f:
        silence = client.audio.transcriptions.create(
            model="tiny.en", file=f, extra_body={"vad_filter": True}
        )
    assert silence.text == ""
