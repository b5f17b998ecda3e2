"""Items a voice-agent client commits at every short pause read as one text.

Agent frameworks run their own VAD and, with `turn_detection: null`, send
`input_audio_buffer.commit` at every pause of `CLIENT_PAUSE_S`: one sentence arrives as several
short items. The test plays such a client: its pauses come from an energy rule over the clip's
20 ms frames, the clip goes out at real-time pace through the official `openai` SDK's realtime
client, and a commit follows as soon as the client has sent `CLIENT_PAUSE_S` of silence after
speech. The items' transcripts, joined, must read as the REST transcript: within one word on jfk
(word edit distance after Whisper's normaliser). What each item was read after is checked
deterministically (no pacing) in `tests/engine/test_client_commits.py`.
"""

from __future__ import annotations

import asyncio
import base64
import time
from typing import Any

import jiwer
import numpy as np
import pytest
from transformers.models.whisper.english_normalizer import EnglishTextNormalizer

from tests.api.conftest import JFK_WAV, LiveServer
from tests.api.test_realtime import COMPLETED, Run, check_items, clip, pcm16, sdk_client
from tests.api.test_stream_ws import rest_text

pytestmark = pytest.mark.timeout(600)

CLIENT_PAUSE_S = 0.2  # the pause a voice-agent client commits at
FRAME_S = 0.02  # the client VAD's frame
QUIET = 0.05  # a frame under 5 % of the clip's loud level (-26 dB) is silence
RATE = 24000  # what the client sends (OpenAI's PCM rate)
CHUNK_S = 0.1  # one append
normalise = EnglishTextNormalizer({})  # Whisper's (as tests/engine/test_wer.py)


def client_commit_points(audio: np.ndarray, rate: int = RATE) -> list[float]:
    """Seconds of audio sent when the client commits: a 20 ms frame is silent below `QUIET` of
    the loud level (the 90th percentile of the frames' RMS); `CLIENT_PAUSE_S` of silent frames
    after speech ends a turn."""
    frame = round(FRAME_S * rate)
    frames = audio[: audio.shape[0] // frame * frame].reshape(-1, frame)
    rms = np.sqrt(np.mean(frames**2, axis=1))
    quiet = rms < QUIET * np.percentile(rms, 90)
    points: list[float] = []
    silent, speech = 0, False
    for i, is_quiet in enumerate(quiet):
        silent = silent + 1 if is_quiet else 0
        speech = speech or not is_quiet
        if speech and silent * FRAME_S >= CLIENT_PAUSE_S - 1e-9:
            points.append((i + 1) * FRAME_S)
            speech = False
    return points


async def stream_with_pause_commits(server: LiveServer, audio: np.ndarray) -> Run:
    """Send the clip (24 kHz) at real-time pace in `CHUNK_S` appends, with a commit at every
    client pause and one at the end; collect events until every item is completed."""
    points = client_commit_points(audio)
    data = pcm16(audio)
    step = round(CHUNK_S * RATE) * 2
    session = {"type": "transcription", "audio": {"input": {
        "format": {"type": "audio/pcm", "rate": RATE}, "turn_detection": None,
        "transcription": {"model": "whisper-1", "language": "en"}}}}  # fmt: skip
    run = Run()
    commits = 0
    async with sdk_client(server).realtime.connect(extra_query={"intent": "transcription"}) as conn:
        await conn.session.update(session=session)  # type: ignore[arg-type]

        async def send() -> None:
            nonlocal commits
            t0 = time.monotonic()
            pending = list(points)
            for i, offset in enumerate(range(0, len(data), step)):
                piece = data[offset : offset + step]
                await conn.input_audio_buffer.append(audio=base64.b64encode(piece).decode())
                sent_s = (offset + len(piece)) / 2 / RATE
                while pending and pending[0] <= sent_s + 1e-9:
                    pending.pop(0)
                    await conn.input_audio_buffer.commit()
                    commits += 1
                delay = t0 + (i + 1) * CHUNK_S - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            if not points or points[-1] < len(data) / 2 / RATE - CHUNK_S:
                await conn.input_audio_buffer.commit()
                commits += 1

        sender = asyncio.create_task(send())
        async for event in conn:
            item: Any = event.to_dict()
            run.events.append((time.monotonic(), item))
            if item["type"] == "error" or (sender.done() and len(run.of(COMPLETED)) >= commits):
                break
        await sender
    return run


def word_errors(reference: str, text: str) -> tuple[int, int]:
    """Word edit distance after Whisper's normaliser, and the reference's word count."""
    ref, hyp = normalise(reference), normalise(text)
    out = jiwer.process_words(ref, hyp or "<empty>")
    return out.substitutions + out.deletions + out.insertions, len(ref.split())


def items_of(run: Run) -> list[str]:
    check_items(run)
    return [e["transcript"] for e in run.of(COMPLETED)]


def test_jfk_committed_at_every_pause_reads_as_the_rest_transcript(server: LiveServer) -> None:
    """Five items ("... Americans," / "ask" / "not" / "what your country ..." / "ask what ...")
    give the REST text within one word."""
    audio = clip(JFK_WAV, RATE)
    rest = rest_text(server, JFK_WAV)
    items = items_of(asyncio.run(asyncio.wait_for(stream_with_pause_commits(server, audio), 120)))
    assert len(items) == len(client_commit_points(audio)) + 1 >= 5, items
    assert word_errors(rest, " ".join(items))[0] <= 1, (items, rest)
