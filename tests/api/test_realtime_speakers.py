"""Who is speaking, live (issue 54): the Realtime protocol with `gpt-4o-transcribe-diarize`,
through the official `openai` SDK's realtime client. Each item's speaker runs come as
`conversation.item.input_audio_transcription.segment` events with labels that hold for the whole
session, or an enrolled voice's name.

The conversation is `tests/conversation.py`'s: speaker 1089, speaker 2412, speaker 1089 again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.api.conftest import LiveServer, start_server, stop_server
from tests.api.test_realtime import COMPLETED, Run, all_completed, clip, pcm16, sdk_run
from tests.conversation import Conversation, read_clip, two_speakers, wav_bytes

pytestmark = pytest.mark.timeout(600)

SEGMENT = "conversation.item.input_audio_transcription.segment"
RATE = 24000
KEY = "speakers-key-0123456789"


@pytest.fixture(scope="module")
def speakers_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    data = tmp_path_factory.mktemp("speakers-data")
    live = start_server(tmp_path_factory.mktemp("speakers"), "speakers", STT_VOICES="true",
                        STT_DATA_DIR=str(data), STT_API_KEY=KEY)  # fmt: skip
    yield live
    stop_server(live)


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
    conversation = two_speakers()
    run = _stream(speakers_server, conversation, {"model": "gpt-4o-transcribe-diarize"})
    _check_segments(run)
    said = [(e["start"], e["end"], e["speaker"], e["text"]) for e in run.of(SEGMENT)]
    assert _by_part(run, conversation) == {0: {"A"}, 1: {"B"}, 2: {"A"}}, said
    reported = run.of("session.updated")[-1]["session"]["audio"]["input"]["transcription"]
    assert reported["model"] == "gpt-4o-transcribe-diarize"


def test_an_enrolled_voice_is_named_live(speakers_server: LiveServer) -> None:
    stephen = wav_bytes(read_clip("1089-134686-0000.flac")[: 8 * 16000])
    enrolled = httpx.post(speakers_server.url("/v1/voices"), headers=speakers_server.auth,
                          files={"file": ("s.wav", stephen)}, data={"name": "stephen"},
                          timeout=120)  # fmt: skip
    assert enrolled.status_code == 200, enrolled.text
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
