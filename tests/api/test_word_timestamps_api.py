"""Word timestamps, usage and token log-probs through the official `openai` SDK against the live
server: OpenAI's shapes (`words`, `usage`, `logprobs`), its rules (word timing needs verbose_json,
logprobs needs json), and the extensions (`probability`, each segment's `words`, `hotwords`)."""

from __future__ import annotations

import itertools

import openai
import pytest

from tests.api.conftest import JFK_TEXT, JFK_WAV, LONG_WAV, LiveServer, normalise

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url("/v1"), api_key="unused", max_retries=0, timeout=120)


def words_create(client: openai.OpenAI, path=JFK_WAV, granularities=("word",), **extra):
    with path.open("rb") as f:
        return client.audio.transcriptions.create(
            model="tiny.en",
            file=f,
            response_format="verbose_json",
            timestamp_granularities=list(granularities),
            **extra,
        )


def test_word_granularity_gives_openais_words(client: openai.OpenAI) -> None:
    result = words_create(client)
    assert isinstance(result, openai.types.audio.TranscriptionVerbose)
    assert result.segments is None  # only what was asked for, as OpenAI answers
    words = result.words
    assert words and all(isinstance(w, openai.types.audio.TranscriptionWord) for w in words)
    assert normalise(" ".join(w.word for w in words)) == normalise(JFK_TEXT)
    assert all(w.word == w.word.strip() for w in words)
    assert all(a.end <= b.start + 1e-6 and a.start <= a.end for a, b in itertools.pairwise(words))
    assert 0.0 <= words[0].start < 0.8 and abs(words[-1].end - 10.4) < 0.5
    assert all(0.0 <= w.model_extra["probability"] <= 1.0 for w in words)
    assert result.usage is not None and result.usage.type == "duration"
    assert result.usage.seconds == 11


def test_word_and_segment_granularities_together(client: openai.OpenAI) -> None:
    result = words_create(client, LONG_WAV, ("segment", "word"), language="en")
    assert result.segments and result.words
    from_segments = []
    for segment in result.segments:
        words = segment.model_extra["words"]
        assert words, segment
        assert segment.start <= words[0]["start"] and words[-1]["end"] <= segment.end
        from_segments += words
    assert [w["word"] for w in from_segments] == [w.word for w in result.words]
    assert all(a.end <= b.start + 1e-6 for a, b in itertools.pairwise(result.words))


def test_words_need_verbose_json(client: openai.OpenAI) -> None:
    with JFK_WAV.open("rb") as f, pytest.raises(openai.BadRequestError) as e:
        client.audio.transcriptions.create(
            model="tiny.en", file=f, response_format="json", timestamp_granularities=["word"]
        )
    assert e.value.body["param"] == "timestamp_granularities[]"
    assert "verbose_json" in e.value.body["message"]


def test_logprobs_and_usage_in_json(client: openai.OpenAI) -> None:
    with JFK_WAV.open("rb") as f:
        result = client.audio.transcriptions.create(
            model="tiny.en", file=f, include=["logprobs"], temperature=0
        )
    assert normalise(result.text) == normalise(JFK_TEXT)
    assert result.logprobs
    text = b"".join(bytes(int(b) for b in p.bytes) for p in result.logprobs).decode()  # SDK: floats
    assert text.strip() == result.text
    assert all(p.logprob <= 0.0 for p in result.logprobs)
    assert sum(p.logprob > -0.5 for p in result.logprobs) > len(result.logprobs) / 2
    assert result.usage is not None and result.usage.seconds == 11


def test_plain_json_has_usage_but_no_logprobs(client: openai.OpenAI) -> None:
    with JFK_WAV.open("rb") as f:
        result = client.audio.transcriptions.create(model="tiny.en", file=f)
    assert result.logprobs is None and result.usage.type == "duration"


def test_logprobs_need_json(client: openai.OpenAI) -> None:
    with JFK_WAV.open("rb") as f, pytest.raises(openai.BadRequestError) as e:
        client.audio.transcriptions.create(
            model="tiny.en", file=f, response_format="verbose_json", include=["logprobs"]
        )
    assert e.value.body["param"] == "include[]"


def test_hotwords_are_accepted(client: openai.OpenAI) -> None:
    result = words_create(client, extra_body={"hotwords": "Americans, country"})
    assert normalise(" ".join(w.word for w in result.words)) == normalise(JFK_TEXT)
