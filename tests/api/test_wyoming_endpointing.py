"""The Wyoming server ends a voice command itself (`STT_WYOMING_ENDPOINTING`, on by default):
it tells Home Assistant it needs no external VAD, and answers at the end of the turn, before
`audio-stop`, with what was said up to there, driven by the `wyoming` package's own client on
a real server with the VAD and the turn model.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from wyoming.asr import Transcribe, Transcript, TranscriptStop
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe, Info

from tests.api.conftest import JFK_WAV, LiveServer, normalise, stop_server
from tests.api.test_wyoming import CHUNK_S, jfk, start_wyoming

pytestmark = pytest.mark.timeout(300)

RATE = 16000
AFTER_STOP_S = 2.0  # how long the client listens after audio-stop for anything more
SILENCE_ON_S = 10.0  # most silence streamed after the audio while no transcript came


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> tuple[LiveServer, int]:
    live, port = start_wyoming(tmp_path_factory, "wyoming-endpointing")  # endpointing: default
    yield live, port
    stop_server(live)


def seconds(pcm: bytes, start: float, end: float | None = None) -> bytes:
    """The 16 kHz 16-bit `pcm` from `start` to `end` seconds."""
    return pcm[int(start * RATE) * 2 : None if end is None else int(end * RATE) * 2]


Timed = list[tuple[float, Event]]


async def command(port: int, audio: bytes, before: list[Event]) -> tuple[Timed, float]:
    """[before...], audio-start, `audio` at real-time pace, then silence on (as a microphone
    goes on) until a transcript came or `SILENCE_ON_S` passed, audio-stop, then listen
    `AFTER_STOP_S` more: every event with its arrival time, and the time audio-stop was sent."""
    events: Timed = []
    async with AsyncTcpClient("127.0.0.1", port) as client:

        async def read() -> None:
            while (event := await client.read_event()) is not None:
                events.append((time.monotonic(), event))

        def answered() -> bool:
            return any(Transcript.is_type(e.type) for _, e in events)

        reader = asyncio.create_task(read())
        for event in before:
            await client.write_event(event)
        await client.write_event(AudioStart(rate=RATE, width=2, channels=1).event())
        step = int(RATE * CHUNK_S) * 2
        silence = b"\0\0" * int(RATE * SILENCE_ON_S)
        for offset in range(0, len(audio) + len(silence), step):
            if offset >= len(audio) and answered():
                break
            piece = (audio + silence)[offset : offset + step]
            chunk = AudioChunk(rate=RATE, width=2, channels=1, audio=piece)
            await client.write_event(chunk.event())
            await asyncio.sleep(CHUNK_S)
        await client.write_event(AudioStop().event())
        stopped = time.monotonic()
        await asyncio.sleep(AFTER_STOP_S)
        reader.cancel()
    return events, stopped


def test_describe_says_the_server_ends_commands_itself(server) -> None:
    async def go() -> Info:
        async with AsyncTcpClient("127.0.0.1", server[1]) as client:
            await client.write_event(Describe().event())
            return Info.from_event(await client.read_event())

    (program,) = asyncio.run(go()).asr
    assert program.requires_external_vad is False
    assert program.prefers_auto_gain_enabled is False
    assert program.prefers_noise_reduction_enabled is False


def test_the_command_is_answered_at_the_end_of_its_turn_before_audio_stop(server) -> None:
    """jfk's last sentence with 1.2 s of silence after "ask what you" (longer than Home
    Assistant's 0.7 s: its own VAD would end the command there; the turn model judges it
    unfinished, P 0.07), 2.5 s of silence after "your country", then speech past the command
    ("and so my fellow Americans") before audio-stop: one transcript, sent in the silence, of
    the whole command and nothing after it."""
    pcm, pause = jfk(RATE), b"\0\0" * int(RATE * 1.2)
    command_audio = seconds(pcm, 8.1, 9.25) + pause + seconds(pcm, 9.25)
    audio = command_audio + b"\0\0" * int(RATE * 2.5) + seconds(pcm, 0.0, 2.3)
    before = [Transcribe(name="tiny.en", language="en").event()]
    events, stopped = asyncio.run(command(server[1], audio, before))
    transcripts = [(t, Transcript.from_event(e)) for t, e in events if Transcript.is_type(e.type)]
    assert len(transcripts) == 1, [e.type for _, e in events]
    (answered, transcript), (_, last) = transcripts[0], events[-1]
    assert answered < stopped - 2.0, (stopped - answered, transcript.text)  # before the speech
    assert TranscriptStop.is_type(last.type), [e.type for _, e in events]
    text = normalise(transcript.text)
    assert text == "ask what you can do for your country", text
    assert "the command ended" in server[0].log_tail()


def spoken(name: str) -> bytes:
    """A LibriSpeech clip of the repo without its leading and trailing silence (PCM at RATE)."""
    pcm = np.frombuffer(jfk(RATE, path=JFK_WAV.parent / name), np.int16)
    loud = np.flatnonzero(np.abs(pcm) > 0.05 * np.abs(pcm).max())
    return pcm[loud[0] : loud[-1] + 1].tobytes()


def test_a_long_command_is_not_cut_at_15_s(server) -> None:
    """Home Assistant's own VAD stops a command at 15 s; ours ends it where the turn ends: a
    ~18 s command (three sentences of one LibriSpeech reader, 0.15 s between them: no pause)
    is one transcript. (Not one sentence said twice: repeated text trips Whisper's compression
    rule, and six attempts of the whole pass outlast the silence a client streams.)"""
    gap = bytes(2 * round(0.15 * RATE))
    said = gap.join(spoken(f"{clip}.flac") for clip in
                    ("1089-134686-0000", "1089-134686-0001", "1089-134691-0001"))  # fmt: skip
    events, stopped = asyncio.run(command(server[1], said, []))
    transcripts = [(t, Transcript.from_event(e)) for t, e in events if Transcript.is_type(e.type)]
    assert len(transcripts) == 1, [e.type for _, e in events]
    answered, transcript = transcripts[0]
    text = normalise(transcript.text)
    assert text.startswith("he hoped there would be stew") and "belly" in text, text
    assert text.endswith("he could wait no longer"), text  # whole
    assert answered < stopped, stopped - answered  # at the end of the turn, in the silence after


def test_an_unknown_vad_sensitivity_gets_an_error_and_the_connection_goes_on(server) -> None:
    async def go() -> tuple[Event | None, Event | None]:
        async with AsyncTcpClient("127.0.0.1", server[1]) as client:
            await client.write_event(Transcribe(language="en", vad_sensitivity="sleepy").event())
            error = await client.read_event()
            await client.write_event(Describe().event())
            return error, await client.read_event()

    error, info = asyncio.run(go())
    assert error is not None and Error.is_type(error.type), error
    refused = Error.from_event(error)
    assert refused.code == "invalid_vad_sensitivity" and "relaxed" in refused.text
    assert info is not None and Info.is_type(info.type)
