"""Who is speaking, live (issue 54), with labels that hold for the whole session or an enrolled
voice's name: the Realtime protocol with `gpt-4o-transcribe-diarize` through the official `openai`
SDK's realtime client (each item's speaker runs as
`conversation.item.input_audio_transcription.segment`), the own WebSocket (`transcript.speakers`
after each segment) and Wyoming (who said the command, in the transcript's context).

The conversation is `tests/conversation.py`'s: speaker 1089, speaker 2412, speaker 1089 again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from wyoming.asr import Transcript, TranscriptStop
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient

from tests.api.conftest import LiveServer, stop_server
from tests.api.test_realtime import COMPLETED, Run, all_completed, clip, pcm16, sdk_run
from tests.api.test_stream_ws import stream_audio, ws_url
from tests.api.test_wyoming import CHUNK_S, start_wyoming
from tests.conversation import PARTS, Conversation, read_clip, two_speakers, wav_bytes

pytestmark = pytest.mark.timeout(600)

SEGMENT = "conversation.item.input_audio_transcription.segment"
RATE = 24000
KEY = "speakers-key-0123456789"


@pytest.fixture(scope="module")
def speakers_wyoming(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, int]]:
    """A server with the voice registry, its Wyoming port saying who spoke."""
    data = tmp_path_factory.mktemp("speakers-data")
    live, port = start_wyoming(tmp_path_factory, "speakers", STT_VOICES="true",
                               STT_DATA_DIR=str(data), STT_API_KEY=KEY,
                               STT_WYOMING_SPEAKERS="true")  # fmt: skip
    yield live, port
    stop_server(live)


@pytest.fixture(scope="module")
def speakers_server(speakers_wyoming: tuple[LiveServer, int]) -> LiveServer:
    return speakers_wyoming[0]


def _forget_voices(server: LiveServer) -> None:
    """No voice enrolled (the tests share one server)."""
    listed = httpx.get(server.url("/v1/voices"), headers=server.auth, timeout=30)
    for voice in listed.json()["data"]:
        url = server.url(f"/v1/voices/{voice['id']}")
        assert httpx.delete(url, headers=server.auth, timeout=30).status_code == 200


def _enrol_stephen(server: LiveServer) -> None:
    """Speaker 1089 enrolled as "stephen" (from a clip not in the conversation), once."""
    stephen = wav_bytes(read_clip("1089-134686-0000.flac")[: 8 * 16000])
    enrolled = httpx.post(server.url("/v1/voices"), headers=server.auth,
                          files={"file": ("s.wav", stephen)}, data={"name": "stephen"},
                          timeout=120)  # fmt: skip
    assert enrolled.status_code == 200 or enrolled.json()["error"]["code"] == "voice_exists"


def _segments_done(last_start_s: float) -> Callable[[Run], bool]:
    """The item of the speech that starts at `last_start_s` ended, every item completed, and
    every one with words has its speaker segments."""

    def done(run: Run) -> bool:
        stops = run.of("input_audio_buffer.speech_stopped")
        last = {e["item_id"] for e in stops if e["audio_end_ms"] > last_start_s * 1000}
        spoken = {e["item_id"] for e in run.of(COMPLETED) if e["transcript"]}
        segmented = {e["item_id"] for e in run.of(SEGMENT)}
        return bool(last) and last <= spoken and all_completed(run) and spoken <= segmented

    return done


def _stream(server: LiveServer, conversation: Conversation, transcription: dict) -> Run:
    session = {"type": "transcription", "audio": {"input": {"transcription": transcription}}}
    audio = pcm16(clip(_wav_file(conversation), RATE)) + bytes(2 * RATE * 2)  # 2 s of quiet after
    done = _segments_done(conversation.spans[-1][0])
    return asyncio.run(sdk_run(server, session, audio, bytes_per_s=2 * RATE, speed=2.0,
                               done=done, timeout=180))  # fmt: skip


def _wav_file(conversation: Conversation) -> Path:
    path = Path(__file__).parent.parent / "artifacts" / "two_speakers.wav"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(conversation.wav)
    return path


def _by_part(run: Run, conversation: Conversation) -> dict[int, set[str]]:
    by_part: dict[int, set[str]] = {}
    for e in run.of(SEGMENT):
        by_part.setdefault(conversation.part_at(e["start"], e["end"]), set()).add(e["speaker"])
    return by_part


def _check_segments(run: Run) -> None:
    """Each item's segments join to its transcript, in order, with their own ids."""
    completed = {e["item_id"]: e["transcript"] for e in run.of(COMPLETED)}
    texts: dict[str, list[str]] = {}
    for e in run.of(SEGMENT):
        texts.setdefault(e["item_id"], []).append(e["text"])
        assert e["start"] <= e["end"] and e["content_index"] == 0, e
    for item, parts in texts.items():
        assert " ".join(parts).split() == completed[item].split(), (parts, completed[item])
    ids = [e["id"] for e in run.of(SEGMENT)]
    assert len(set(ids)) == len(ids)


def test_speaker_labels_hold_across_the_items_of_a_session(speakers_server: LiveServer) -> None:
    _forget_voices(speakers_server)
    conversation = two_speakers()
    run = _stream(speakers_server, conversation, {"model": "gpt-4o-transcribe-diarize"})
    _check_segments(run)
    said = [(e["start"], e["end"], e["speaker"], e["text"]) for e in run.of(SEGMENT)]
    assert _by_part(run, conversation) == {0: {"A"}, 1: {"B"}, 2: {"A"}}, said
    reported = run.of("session.updated")[-1]["session"]["audio"]["input"]["transcription"]
    assert reported["model"] == "gpt-4o-transcribe-diarize"


def test_an_enrolled_voice_is_named_live(speakers_server: LiveServer) -> None:
    _enrol_stephen(speakers_server)
    conversation = two_speakers()
    run = _stream(speakers_server, conversation, {"model": "tiny.en", "speakers": True})
    said = [(e["start"], e["end"], e["speaker"], e["text"]) for e in run.of(SEGMENT)]
    assert _by_part(run, conversation) == {0: {"stephen"}, 1: {"A"}, 2: {"stephen"}}, said


def test_the_speakers_setting_takes_a_boolean(server: LiveServer) -> None:
    asked = {"transcription": {"speakers": "yes"}}
    session: dict[str, Any] = {"type": "transcription", "audio": {"input": asked}}
    run = asyncio.run(sdk_run(server, session, b"", bytes_per_s=2 * RATE,
                              done=lambda r: bool(r.of("error")), timeout=30))  # fmt: skip
    [error] = run.of("error")
    assert error["error"]["param"] == "session.audio.input.transcription.speakers", error


def test_the_own_websocket_sends_each_segments_speakers(speakers_server: LiveServer) -> None:
    """Each segment's runs of one speaker, labelled for the session or named (1089 enrolled)."""
    _enrol_stephen(speakers_server)
    conversation = two_speakers()
    pcm = pcm16(clip(_wav_file(conversation), 16000)) + bytes(2 * 16000 * 2)
    run = asyncio.run(stream_audio(ws_url(speakers_server), pcm, session={"speakers": True},
                                   speed=2.0, headers=speakers_server.auth))  # fmt: skip
    segments = {e["segment"]["id"]: e["segment"]["text"] for e in run.of("transcript.segment")}
    by_part: dict[int, set[str]] = {}
    for e in run.of("transcript.speakers"):
        runs = e["speakers"]
        assert " ".join(r["text"] for r in runs).split() == segments[e["segment_id"]].split()
        for r in runs:
            by_part.setdefault(conversation.part_at(r["start"], r["end"]), set()).add(r["speaker"])
    assert {e["segment_id"] for e in run.of("transcript.speakers")} == set(segments)
    assert by_part == {0: {"stephen"}, 1: {"A"}, 2: {"stephen"}}, run.of("transcript.speakers")
    assert run.of("session.updated")[-1]["session"]["speakers"] is True


async def _commands(port: int, parts: list[np.ndarray]) -> list[Transcript]:
    """Each part a voice command on one Wyoming connection (sent at once, then audio-stop):
    the transcripts."""
    transcripts = []
    async with AsyncTcpClient("127.0.0.1", port) as client:
        for audio in parts:
            pcm = pcm16(audio)
            await client.write_event(AudioStart(rate=16000, width=2, channels=1).event())
            step = int(16000 * CHUNK_S) * 2
            for offset in range(0, len(pcm), step):
                piece = pcm[offset : offset + step]
                await client.write_event(AudioChunk(rate=16000, width=2, channels=1,
                                                    audio=piece).event())  # fmt: skip
            await client.write_event(AudioStop().event())
            while not TranscriptStop.is_type((event := await client.read_event()).type):
                if Transcript.is_type(event.type):
                    transcripts.append(Transcript.from_event(event))
    return transcripts


def test_wyoming_says_who_said_each_command(speakers_wyoming: tuple[LiveServer, int]) -> None:
    """Three commands on one connection, speakers 1089 (enrolled as "stephen"), 2412, 1089: the
    enrolled name, a label for the stranger, the name again."""
    server, port = speakers_wyoming
    _enrol_stephen(server)
    parts = [read_clip(name)[: 6 * 16000] for name in PARTS]
    transcripts = asyncio.run(asyncio.wait_for(_commands(port, parts), 180))
    said = [(t.text, t.context) for t in transcripts]
    assert [(t.context or {}).get("speaker") for t in transcripts] == ["stephen", "A", "stephen"], (
        said
    )
