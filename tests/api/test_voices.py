"""The voice registry (issue 54) on the live server: voices enrolled once over REST, named by
diarization through the official `openai` SDK with no reference clip, kept across a restart, and
every bad enrolment refused with the registry unchanged.

The conversation is `tests/conversation.py`'s (speaker 1089, speaker 2412, speaker 1089 again);
1089 is enrolled from another of his utterances, JFK as a second voice nobody in it has.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from app.service.voices.store import FILE_NAME, VoiceStore
from tests.api.conftest import (
    JFK_WAV,
    LiveServer,
    assert_openai_error,
    start_server,
    stop_server,
)
from tests.conversation import RATE, Conversation, read_clip, two_speakers, wav_bytes

pytestmark = pytest.mark.timeout(300)

KEY = "voices-key-0123456789"
OTHER = "2412-153948-0000.flac"  # 11.7 s of the conversation's second speaker


def _serve(folder: Path, data: Path, name: str) -> LiveServer:
    return start_server(folder, name, STT_VOICES="true", STT_DATA_DIR=str(data), STT_API_KEY=KEY)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("voices-data")


@pytest.fixture(scope="module")
def voices_server(tmp_path_factory: pytest.TempPathFactory, data_dir: Path) -> Iterator[LiveServer]:
    live = _serve(tmp_path_factory.mktemp("voices"), data_dir, "voices")
    yield live
    stop_server(live)


def _enrol(server: LiveServer, name: str, audio: bytes, **fields: object) -> httpx.Response:
    return httpx.post(
        server.url("/v1/voices"),
        headers=server.auth,
        files={"file": ("voice.wav", audio)},
        data={"name": name, **fields},
        timeout=120,
    )


def _names(server: LiveServer) -> list[str]:
    listed = httpx.get(server.url("/v1/voices"), headers=server.auth, timeout=30)
    assert listed.status_code == 200, listed.text
    return sorted(v["name"] for v in listed.json()["data"])


@pytest.fixture(scope="module")
def enrolled(voices_server: LiveServer) -> dict[str, dict]:
    """Stephen (speaker 1089: the first 8 s of an utterance not in the conversation, taken as a
    segment of the whole 10.4 s clip) and John (jfk)."""
    stephen = wav_bytes(read_clip("1089-134686-0000.flac"))
    first = _enrol(voices_server, "stephen", stephen, start="0", end="8", keep_audio="true")
    second = _enrol(voices_server, "john", JFK_WAV.read_bytes())
    assert first.status_code == 200, first.text
    assert second.status_code == 200, second.text
    return {"stephen": first.json(), "john": second.json()}


def _client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url("/v1"), api_key=KEY, max_retries=0, timeout=180)


def _speaker_by_part(server: LiveServer, conversation: Conversation, names: list[str]) -> dict:
    result = _client(server).audio.transcriptions.create(
        model="gpt-4o-transcribe-diarize",
        file=("talk.wav", conversation.wav),
        response_format="diarized_json",
        known_speaker_names=names,
    )
    by_part: dict[int, set[str]] = {}
    for s in result.segments:
        by_part.setdefault(conversation.part_at(s.start, s.end), set()).add(s.speaker)
    return by_part


def test_an_enrolled_voice_is_named_without_a_reference_clip(
    voices_server: LiveServer, enrolled: dict[str, dict]
) -> None:
    stephen = enrolled["stephen"]
    assert stephen["id"].startswith("voice_") and stephen["object"] == "voice"
    assert 6.0 <= stephen["speech_seconds"] <= 8.0, stephen  # the 8 s segment, its speech
    assert stephen["audio_kept"] and not enrolled["john"]["audio_kept"]
    assert set(stephen) == {
        "id", "object", "name", "created_at", "speech_seconds", "audio_kept", "stale",
    }  # fmt: skip
    got = httpx.get(voices_server.url(f"/v1/voices/{stephen['id']}"), headers=voices_server.auth)
    assert got.json() == stephen
    # John is enrolled and named too: the unknown speaker 2412 must not be given his name
    by_part = _speaker_by_part(voices_server, two_speakers(), ["stephen", "john"])
    assert by_part == {0: {"stephen"}, 1: {"A"}, 2: {"stephen"}}, by_part


def test_a_name_that_is_not_enrolled_is_a_400_naming_it(
    voices_server: LiveServer, enrolled: dict[str, dict]
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        _speaker_by_part(voices_server, two_speakers(), ["stephen", "nobody"])
    error = caught.value.body
    assert error["param"] == "known_speaker_names[]" and "'nobody'" in error["message"], error


def _silence(seconds: float) -> bytes:
    return wav_bytes(np.zeros(int(seconds * RATE), np.float32))


@pytest.mark.parametrize(
    ("name", "audio", "fields", "status", "param", "says"),
    [
        ("short", lambda: JFK_WAV.read_bytes(), {"end": "1.5"}, 400, "file", "2 to 30 s"),
        ("long", lambda: wav_bytes(np.tile(read_clip(OTHER), 3)), {}, 400, "file", "35.0 s"),
        ("silent", lambda: _silence(5.0), {}, 400, "file", "no speech"),
        ("two", lambda: two_speakers().wav, {}, 400, "file", "2 speakers"),
        ("noise", lambda: b"not audio at all", {}, 415, "file", ""),
        ("outside", lambda: JFK_WAV.read_bytes(), {"start": "10", "end": "14"}, 400, "end", ""),
        ("   ", lambda: JFK_WAV.read_bytes(), {}, 400, "name", "1 to 64"),
        ("stephen", lambda: JFK_WAV.read_bytes(), {}, 409, "name", "enrolled already"),
    ],
)
def test_a_bad_enrolment_is_refused_and_writes_nothing(
    voices_server: LiveServer,
    enrolled: dict[str, dict],
    name: str,
    audio,
    fields: dict,
    status: int,
    param: str,
    says: str,
) -> None:
    before = _names(voices_server)
    error = assert_openai_error(_enrol(voices_server, name, audio(), **fields), status, param)
    assert says in error["message"], error
    assert _names(voices_server) == before


def test_the_registry_needs_the_key_and_unknown_ids_are_404(
    voices_server: LiveServer, enrolled: dict[str, dict]
) -> None:
    assert httpx.get(voices_server.url("/v1/voices")).status_code == 401
    missing = httpx.get(voices_server.url("/v1/voices/voice_0"), headers=voices_server.auth)
    assert assert_openai_error(missing, 404, None)["code"] == "voice_not_found"


def test_voices_off_is_a_403_naming_the_setting(server: LiveServer) -> None:
    error = assert_openai_error(httpx.get(server.url("/v1/voices")), 403, None)
    assert "STT_VOICES" in error["message"] and error["code"] == "voices_disabled"


def test_a_locked_registry_is_a_503_to_retry_and_the_server_goes_on(
    voices_server: LiveServer, enrolled: dict[str, dict], data_dir: Path
) -> None:
    holder = sqlite3.connect(data_dir / FILE_NAME)
    holder.execute("BEGIN EXCLUSIVE")  # another process holds the file's write lock
    try:
        response = _enrol(voices_server, "late", JFK_WAV.read_bytes())
        error = assert_openai_error(response, 503, None)
        assert "locked" in error["message"] and response.headers["Retry-After"], error
    finally:
        holder.rollback()
        holder.close()
    assert _names(voices_server) == ["john", "stephen"]


def test_voices_of_other_speaker_models_are_made_again_or_marked_stale(
    voices_server: LiveServer, enrolled: dict[str, dict], data_dir: Path
) -> None:
    """A voice written by other speaker models: with its audio it is made again by these, without
    it it is listed stale and refused by name."""
    store = VoiceStore(data_dir / FILE_NAME)  # the server's file, written from this process
    stephen = store.get(enrolled["stephen"]["id"])
    store.remade(stephen.id, "0" * 16, -stephen.embedding)  # what other models made of him
    old = store.add("old", "0" * 16, stephen.embedding, 5.0)
    try:
        answer = httpx.get(voices_server.url("/v1/voices"), headers=voices_server.auth)
        listed = {v["name"]: v for v in answer.json()["data"]}
        assert listed["old"]["stale"] and not listed["stephen"]["stale"], listed
        by_part = _speaker_by_part(voices_server, two_speakers(), ["stephen"])
        assert by_part == {0: {"stephen"}, 1: {"A"}, 2: {"stephen"}}, by_part
        remade = store.get(stephen.id)  # made again from the kept audio (16-bit WAV)
        assert remade.model == stephen.model and remade.embedding @ stephen.embedding > 0.99
        with pytest.raises(openai.APIStatusError) as caught:
            _speaker_by_part(voices_server, two_speakers(), ["old"])
        assert caught.value.status_code == 409 and "enrol it again" in caught.value.message
    finally:
        store.delete(old.id)


def test_a_restart_keeps_the_voices_and_a_delete_removes_one(
    voices_server: LiveServer,
    enrolled: dict[str, dict],
    data_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    again = _serve(tmp_path_factory.mktemp("voices-again"), data_dir, "voices-again")
    try:
        assert _names(again) == ["john", "stephen"]
        john = enrolled["john"]["id"]
        deleted = httpx.delete(again.url(f"/v1/voices/{john}"), headers=again.auth)
        assert deleted.json() == {"id": john, "object": "voice.deleted", "deleted": True}
        assert _names(voices_server) == ["stephen"]  # one file, both servers
        gone = httpx.delete(again.url(f"/v1/voices/{john}"), headers=again.auth)
        assert_openai_error(gone, 404, None)
    finally:
        stop_server(again)


def test_a_damaged_registry_file_is_a_500_naming_it_and_the_server_goes_on(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    data = tmp_path_factory.mktemp("damaged")
    (data / FILE_NAME).write_bytes(b"this is not a database" * 200)
    live = _serve(tmp_path_factory.mktemp("damaged-server"), data, "damaged")
    try:
        error = assert_openai_error(httpx.get(live.url("/v1/voices"), headers=live.auth), 500, None)
        assert FILE_NAME in error["message"] and "move it away" in error["message"], error
        health = httpx.get(live.url("/health"))
        assert health.status_code == 200
    finally:
        stop_server(live)
