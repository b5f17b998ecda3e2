"""Who said what, through the official `openai` SDK on the live server (issue 33).

The conversation is made from the repository's LibriSpeech clips (`tests/conversation.py`:
speaker 1089, speaker 2412, speaker 1089 again). Known speakers are named by a reference clip from
another of 1089's utterances.
"""

from __future__ import annotations

import asyncio
import base64

import httpx
import numpy as np
import openai
import pytest
from openai.types.audio import TranscriptionDiarized

from tests.api.conftest import (
    JFK_WAV,
    LiveServer,
    assert_openai_error,
    normalise,
    start_server,
    stop_server,
)
from tests.api.subtitles import parse_vtt
from tests.api.test_stream_ws import stream_audio, ws_url
from tests.conftest import AUDIO
from tests.conversation import GAP_S, RATE, Conversation, read_clip, two_speakers, wav_bytes

pytestmark = pytest.mark.timeout(300)

EMPTY_WAV = AUDIO / "picovoice_empty.wav"


def _data_url(audio: np.ndarray) -> str:
    return "data:audio/wav;base64," + base64.b64encode(wav_bytes(audio)).decode()


@pytest.fixture(scope="module")
def conversation() -> Conversation:
    return two_speakers()


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url("/v1"), api_key="unused", max_retries=0, timeout=180)


def _stephen() -> str:
    """A reference clip of speaker 1089 (8 s of another utterance than the conversation's)."""
    return _data_url(read_clip("1089-134686-0000.flac")[: 8 * RATE])


def test_two_speakers_take_turns_in_openais_diarized_shape(
    client: openai.OpenAI, conversation: Conversation
) -> None:
    result = client.audio.transcriptions.create(
        model="tiny.en", file=("talk.wav", conversation.wav), response_format="diarized_json"
    )
    assert isinstance(result, TranscriptionDiarized)
    assert result.task == "transcribe"
    assert abs(result.duration - conversation.spans[-1][1] - GAP_S) < 0.01
    assert all(s.type == "transcript.text.segment" for s in result.segments)
    assert len({s.id for s in result.segments}) == len(result.segments)
    by_part: dict[int, set[str]] = {}
    for s in result.segments:
        by_part.setdefault(conversation.part_at(s.start, s.end), set()).add(s.speaker)
    assert by_part == {0: {"A"}, 1: {"B"}, 2: {"A"}}, result.segments
    b_text = normalise(" ".join(s.text for s in result.segments if s.speaker == "B"))
    assert b_text.startswith("if the reader will excuse me") and "stuff" not in b_text
    assert normalise(result.text).startswith("stuff it into you")


def test_known_speakers_are_named_and_segments_stream(
    client: openai.OpenAI, conversation: Conversation
) -> None:
    stream = client.audio.transcriptions.create(
        model="gpt-4o-transcribe-diarize",
        file=("talk.wav", conversation.wav),
        response_format="diarized_json",
        known_speaker_names=["stephen"],
        known_speaker_references=[_stephen()],
        chunking_strategy="auto",
        stream=True,
    )
    events = list(stream)
    assert events[-1].type == "transcript.text.done"
    assert [lang.code for lang in events[-1].languages or []] == ["en"]
    segments = [e for e in events[:-1] if e.type == "transcript.text.segment"]
    assert len(segments) == len(events) - 1
    speakers = [(conversation.part_at(e.start, e.end), e.speaker) for e in segments]
    assert {p: s for p, s in speakers} == {0: "stephen", 1: "A", 2: "stephen"}, speakers
    assert len(set(speakers)) == 3  # each part one speaker
    # segments finished before the speaker turns were known were held, then sent in order
    times = [(e.start, e.end) for e in segments]
    assert times == sorted(times) and all(a <= b for a, b in times), times
    assert len({e.id for e in segments}) == len(segments)
    assert normalise(" ".join(e.text for e in segments)) == normalise(events[-1].text)


def test_vtt_and_verbose_json_carry_the_speaker_with_diarize(
    client: openai.OpenAI, conversation: Conversation
) -> None:
    vtt = client.audio.transcriptions.create(
        model="tiny.en",
        file=("talk.wav", conversation.wav),
        response_format="vtt",
        chunking_strategy={"type": "server_vad", "threshold": 0.5, "silence_duration_ms": 500},
        extra_body={"diarize": "true", "num_speakers": "2"},
    )
    cues = parse_vtt(vtt)
    assert [c.text.startswith(("<v A>", "<v B>")) for c in cues] == [True] * len(cues)
    b_cues = [normalise(c.text.removeprefix("<v B>")) for c in cues if c.text.startswith("<v B>")]
    assert any(text.startswith("if the reader") for text in b_cues), vtt
    verbose = client.audio.transcriptions.create(
        model="tiny.en",
        file=("talk.wav", conversation.wav),
        response_format="verbose_json",
        timestamp_granularities=["word", "segment"],
        extra_body={"diarize": "true"},
    )
    words = [w.model_dump() for w in verbose.words or ()]
    assert words and all(w["speaker"] in ("A", "B") for w in words)
    for w in words:
        assert w["speaker"] == "AB"[conversation.part_at(w["start"], w["end"]) % 2], w
    assert {s.model_dump()["speaker"] for s in verbose.segments or ()} == {"A", "B"}


def test_silence_has_no_speaker_and_is_no_error(client: openai.OpenAI) -> None:
    result = client.audio.transcriptions.create(
        model="tiny.en", file=EMPTY_WAV.open("rb"), response_format="diarized_json"
    )
    assert len({s.speaker for s in result.segments}) <= 1


def _post(server: LiveServer, files: dict, **data: object) -> httpx.Response:
    return httpx.post(
        server.url("/v1/audio/transcriptions"),
        files={"file": ("jfk.wav", JFK_WAV.read_bytes()), **files},
        data={"model": "tiny.en", "response_format": "diarized_json", **data},
        timeout=60,
    )


REFERENCES = "known_speaker_references[]"


def _known(reference: str) -> dict[str, list[str]]:
    return {"known_speaker_names[]": ["ann"], REFERENCES: [reference]}


@pytest.mark.parametrize(
    ("fields", "param", "says"),
    [
        ({"known_speaker_names[]": ["ann"]}, REFERENCES, "same number"),
        (_known("not a url"), REFERENCES, "data URL"),
        (_known("data:audio/wav;base64,aGVsbG8="), REFERENCES, "not audio"),  # b"hello"
        (_known(_data_url(np.zeros(RATE, np.float32))), REFERENCES, "2 to 10 s"),
        ({"timestamp_granularities[]": ["word"]}, "timestamp_granularities[]", "verbose_json"),
        ({"num_speakers": "0"}, "num_speakers", ""),
        ({"chunking_strategy[threshold]": "5"}, "chunking_strategy[threshold]", ""),
        ({"chunking_strategy": "later"}, "chunking_strategy", ""),
        ({"min_speakers": "3", "max_speakers": "2"}, "min_speakers", "must not exceed"),
    ],
)
def test_bad_speaker_fields_are_a_400_naming_the_field(
    server: LiveServer, fields: dict, param: str, says: str
) -> None:
    error = assert_openai_error(_post(server, {}, **fields), 400, param)
    assert says in error["message"]


def test_speaker_fields_without_diarization_are_refused(server: LiveServer) -> None:
    response = _post(server, {}, response_format="json", num_speakers="2")
    error = assert_openai_error(response, 400, "num_speakers")
    assert "diarized_json" in error["message"]


def test_diarization_off_refuses_speakers_naming_the_setting_and_loads_no_models(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    off = start_server(tmp_path_factory.mktemp("off"), "no-diarization", STT_DIARIZATION="false")
    try:
        for fields, param in [
            ({}, "response_format"),
            ({"response_format": "vtt", "diarize": "true"}, "diarize"),
            ({"response_format": "json", "model": "gpt-4o-transcribe-diarize"}, "model"),
        ]:
            error = assert_openai_error(_post(off, {}, **fields), 403, param)
            assert "STT_DIARIZATION=false" in error["message"]
            assert error["code"] == "diarization_disabled"
        live = asyncio.run(stream_audio(ws_url(off), b"", session={"speakers": True}))
        [error] = [e["error"] for e in live.of("error")]
        assert (error["param"], error["code"]) == ("session.speakers", "diarization_disabled")
        plain = _post(off, {}, response_format="json")
        assert plain.status_code == 200 and "country" in plain.json()["text"]
        assert "segmentation.onnx" not in off.log_path.read_text()  # logged by every load
    finally:
        stop_server(off)
