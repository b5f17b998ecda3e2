"""Realtime `semantic_vad` through the official `openai` SDK's realtime client, at real-time
pace: a pause the turn model judges unfinished holds the item open, a finished sentence ends it.

The clip: jfk with its pause after "Americans" shortened to 0.2 s, so that its pauses are
mid-sentence: "And so my fellow Americans ask not [a 1 s pause] what your country can do for you,
[0.5 s] ask what you can do for your country." (the turn model's P(finished) there: 0.08, 0.02,
then 0.95 at the end). Server VAD (500 ms of silence) cuts it at "ask not"; semantic_vad keeps
one item. Two sentences 2 s apart are two items.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from tests.api.conftest import JFK_TEXT, JFK_WAV, LiveServer
from tests.api.test_realtime import COMPLETED, Run, all_completed, check_items, clip, pcm16, sdk_run
from tests.api.test_stream_ws import assert_close
from tests.conftest import AUDIO

pytestmark = pytest.mark.timeout(300)

RATE = 24000
AMERICANS = (2.28, 3.18)  # jfk: cut from its pause after "Americans" (2.18-3.28 s)
SENTENCE = AUDIO / "1089-134691-0000.flac"  # a 2.1 s sentence, no pause inside
# the item holds the whole sentence: tiny.en's live reading of the spliced clip may miss a few
# words ("American asked not", "What you are country"); what is checked is where items end
MAX_WER = 0.2


def silence(seconds: float) -> np.ndarray:
    return np.zeros(round(seconds * RATE), np.float32)


def session(turns: dict) -> dict:
    return {"type": "transcription", "audio": {"input": {
        "format": {"type": "audio/pcm", "rate": RATE}, "turn_detection": turns,
        "transcription": {"model": "whisper-1", "language": "en"}}}}  # fmt: skip


def items_done(count: int):
    def done(run: Run) -> bool:
        return all_completed(run) and len(run.of(COMPLETED)) >= count

    return done


def stream(server: LiveServer, turns: dict, audio: np.ndarray, items: int) -> Run:
    run = asyncio.run(
        sdk_run(server, session(turns), pcm16(audio), bytes_per_s=2 * RATE,
                done=items_done(items))
    )  # fmt: skip
    check_items(run)
    return run


@pytest.fixture(scope="module")
def jfk() -> np.ndarray:
    audio = clip(JFK_WAV, RATE)
    cut = [round(t * RATE) for t in AMERICANS]
    return np.concatenate([audio[: cut[0]], audio[cut[1] :], silence(3.0)])


def test_a_mid_sentence_pause_stays_in_one_item_with_semantic_vad(
    server: LiveServer, jfk: np.ndarray
) -> None:
    run = stream(server, {"type": "semantic_vad", "eagerness": "auto"}, jfk, 1)
    (completed,) = run.of(COMPLETED)
    assert_close(completed["transcript"], JFK_TEXT, MAX_WER)
    (stopped,) = run.of("input_audio_buffer.speech_stopped")
    assert stopped["audio_end_ms"] > 9000  # at the sentence's end


def test_server_vad_cuts_the_same_pause(server: LiveServer, jfk: np.ndarray) -> None:
    """The check above can fail: 500 ms of silence ends server VAD's turn at "ask not"."""
    run = stream(server, {"type": "server_vad", "silence_duration_ms": 500}, jfk, 2)
    assert len(run.of(COMPLETED)) >= 2
    assert "country" not in run.of(COMPLETED)[0]["transcript"].lower()


def test_two_sentences_two_seconds_apart_are_two_items(server: LiveServer, jfk: np.ndarray) -> None:
    audio = np.concatenate([clip(SENTENCE, RATE), silence(2.0), jfk])
    run = stream(server, {"type": "semantic_vad", "eagerness": "high"}, audio, 2)
    first, second = [e["transcript"] for e in run.of(COMPLETED)]
    assert first and "americans" not in first.lower(), (first, second)
    assert_close(second, JFK_TEXT, MAX_WER)
