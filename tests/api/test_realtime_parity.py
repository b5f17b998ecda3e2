"""The Realtime transcription settings OpenAI documents beyond the basics, through the official
`openai` SDK's realtime client against a real server: `include` logprobs and the `languages`
output on completed items, `keywords`, `languages` (candidates) and `delay` taken and reported,
`turn_detection.idle_timeout_ms` with `input_audio_buffer.timeout_triggered`."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from benchmarks.wer_paired import CORPUS
from tests.api.conftest import JFK_WAV, LiveServer, normalise
from tests.api.test_realtime import (
    COMPLETED,
    JFK_LAST_TURN_ENDS_AFTER_MS,
    Run,
    all_completed,
    clip,
    pcm16,
    sdk_run,
)
from tests.api.test_stream_ws import JFK_MAX_WER, assert_close, rest_text

pytestmark = pytest.mark.timeout(600)

LOGPROBS = "item.input_audio_transcription.logprobs"
TIMEOUT = "input_audio_buffer.timeout_triggered"
RATE = 24000


def session(transcription: dict[str, Any], turns: Any = None, **more: Any) -> dict[str, Any]:
    inputs = {"transcription": transcription, "turn_detection": turns}
    return {"type": "transcription", "audio": {"input": inputs}, **more}


async def commit(conn: Any) -> None:
    await conn.input_audio_buffer.commit()


def one_item(server: LiveServer, config: dict[str, Any], audio: bytes) -> Run:
    """`audio` sent at once as one client-committed item."""
    return asyncio.run(sdk_run(server, config, audio, bytes_per_s=2 * RATE, speed=None,
                               after=commit, done=all_completed))  # fmt: skip


def test_completed_items_name_their_language_and_carry_the_log_probs_asked_for(
    server: LiveServer,
) -> None:
    audio = pcm16(clip(JFK_WAV, RATE))
    wanted = {"keywords": ["Americans"], "delay": "low"}
    run = one_item(server, session(wanted, include=[LOGPROBS]), audio)
    reported = run.of("session.updated")[-1]["session"]
    assert reported["include"] == [LOGPROBS]
    assert {k: reported["audio"]["input"]["transcription"][k] for k in wanted} == wanted
    [done] = run.of(COMPLETED)
    assert done["languages"] == [{"code": "en"}]
    assert_close(done["transcript"], rest_text(server, JFK_WAV), JFK_MAX_WER)
    logprobs = done["logprobs"]
    text = b"".join(bytes(t["bytes"]) for t in logprobs).decode("utf-8")
    assert normalise(text) == normalise(done["transcript"])  # every token, in order
    assert all(t["logprob"] <= 0 and t["token"] == bytes(t["bytes"]).decode() for t in logprobs)
    assert np.mean([t["logprob"] for t in logprobs]) > -0.5  # clear speech: confident tokens

    [plain] = one_item(server, session({}), audio).of(COMPLETED)  # not asked for: none
    assert plain.get("logprobs") is None and plain["languages"] == [{"code": "en"}]


def test_keywords_spell_the_names_they_name(server: LiveServer) -> None:
    """tiny.en hears a LibriSpeech reader's "said Albert ... returned Franz" as "Said Albaar
    ... return friends"; named as keywords, the names are spelled."""
    audio = pcm16(clip(CORPUS / "audio" / "7367-86737-0001.flac", RATE))
    texts = [
        one_item(server, session(transcription), audio).of(COMPLETED)[0]["transcript"]
        for transcription in ({}, {"keywords": ["Albert", "Franz"]})
    ]
    assert ["Albert" in text and "Franz" in text for text in texts] == [False, True], texts


def test_languages_limit_detection_to_the_candidates(server: LiveServer, base: str) -> None:
    audio = pcm16(clip(JFK_WAV, RATE)[: RATE * 4])  # English, but only German or French allowed
    run = one_item(server, session({"model": base, "languages": ["de", "French"]}), audio)
    [done] = run.of(COMPLETED)
    assert done["languages"] in ([{"code": "de"}], [{"code": "fr"}])
    reported = run.of("session.updated")[-1]["session"]["audio"]["input"]["transcription"]
    assert reported["languages"] == ["de", "French"]


def test_silence_past_the_idle_timeout_is_an_empty_item_and_speech_after_it_is_read(
    server: LiveServer,
) -> None:
    lead, tail = np.zeros(RATE * 3, np.float32), np.zeros(RATE * 3 // 2, np.float32)
    audio = pcm16(np.concatenate([lead, clip(JFK_WAV, RATE), tail]))  # the tail: < the timeout
    turns = {"type": "server_vad", "idle_timeout_ms": 2000}

    def done(run: Run) -> bool:  # the last turn (it ends ~10.5 s into jfk) committed and read
        last = 3000 + JFK_LAST_TURN_ENDS_AFTER_MS
        stopped = [e for e in run.of("input_audio_buffer.speech_stopped")
                   if e["audio_end_ms"] >= last]  # fmt: skip
        completed = {e["item_id"] for e in run.of(COMPLETED)}
        return bool(stopped) and stopped[-1]["item_id"] in completed and all_completed(run)

    run = asyncio.run(sdk_run(server, session({}, turns), audio, bytes_per_s=2 * RATE,
                              speed=None, done=done))  # fmt: skip
    [timeout] = run.of(TIMEOUT)  # jfk's own pauses are far shorter: no second one
    assert timeout["audio_start_ms"] == 0 and 2000 <= timeout["audio_end_ms"] <= 2500
    empty = timeout["item_id"]
    order = [e["type"] for _, e in run.events if e.get("item_id") == empty]
    assert order[:3] == [TIMEOUT, "input_audio_buffer.committed", COMPLETED], order
    completed = {e["item_id"]: e["transcript"] for e in run.of(COMPLETED)}
    assert completed[empty] == ""
    spoken = " ".join(t for item, t in completed.items() if item != empty)
    assert_close(spoken, rest_text(server, JFK_WAV), JFK_MAX_WER)
    started = run.of("input_audio_buffer.speech_started")
    assert started and all(e["audio_start_ms"] >= 2000 for e in started)
