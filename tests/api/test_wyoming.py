"""The Wyoming protocol (Home Assistant) on a real server, driven by the `wyoming` package's own
client: describe, jfk -> its text with transcript chunks while the audio still arrives, other
rates and channel counts, bad input answered with `error` events, limits, two clients at once.
Here the client ends each command (`audio-stop`, endpointing off); the server ending it:
`test_wyoming_endpointing.py`.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import soxr
from wyoming.asr import Transcribe, Transcript, TranscriptChunk, TranscriptStart, TranscriptStop
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe, Info

from tests.api.conftest import (
    JFK_TEXT,
    JFK_WAV,
    LiveServer,
    free_port,
    normalise,
    start_server,
    stop_server,
)

pytestmark = pytest.mark.timeout(300)

IDLE_S = 3
MAX_FRAME_KB = 64
MAX_CLIENTS = 3
MAX_SESSIONS = 2  # live sessions of the server: Wyoming utterances count as such
CHUNK_S = 0.1


def start_wyoming(
    tmp_path_factory: pytest.TempPathFactory, name: str, **settings: str
) -> tuple[LiveServer, int]:
    """A server with the Wyoming port on (no mDNS): it and the port."""
    port = free_port()
    live = start_server(
        tmp_path_factory.mktemp(name),
        name,
        STT_WYOMING_PORT=str(port),
        STT_WYOMING_HOST="127.0.0.1",
        STT_WYOMING_ZEROCONF="",
        **settings,
    )
    return live, port


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> tuple[LiveServer, int]:
    live, port = start_wyoming(
        tmp_path_factory,
        "wyoming",
        STT_WYOMING_MAX_CLIENTS=str(MAX_CLIENTS),
        STT_STREAM_MAX_SESSIONS=str(MAX_SESSIONS),
        STT_STREAM_IDLE_TIMEOUT_S=str(IDLE_S),
        STT_STREAM_MAX_FRAME_KB=str(MAX_FRAME_KB),
        STT_WYOMING_ENDPOINTING="false",  # Home Assistant's VAD ends commands (audio-stop)
    )
    yield live, port
    stop_server(live)


def jfk(rate: int, channels: int = 1, path: Path = JFK_WAV) -> bytes:
    """jfk.wav (or `path`) as 16-bit PCM at `rate` Hz, `channels` interleaved copies."""
    audio, source_rate = sf.read(path, dtype="float32")
    audio = soxr.resample(audio, source_rate, rate)
    pcm = (np.clip(audio, -1, 1) * 32767).astype("<i2")
    return np.repeat(pcm[:, None], channels, axis=1).tobytes()


async def utterance(
    port: int,
    audio: bytes,
    rate: int,
    channels: int = 1,
    *,
    pace: float = 0.0,
    before: list[Event] = (),  # type: ignore[assignment]
) -> tuple[list[Event], int]:
    """Send [before...], audio-start, the audio in 100 ms chunks (`pace` s apart), audio-stop;
    read all along. Returns the events received until transcript-stop (or an error / close),
    and how many of them arrived before audio-stop was sent."""
    events: list[Event] = []
    async with AsyncTcpClient("127.0.0.1", port) as client:

        async def read() -> None:
            while (event := await client.read_event()) is not None:
                events.append(event)
                if TranscriptStop.is_type(event.type) or Error.is_type(event.type):
                    return

        reader = asyncio.create_task(read())
        for event in before:
            await client.write_event(event)
        await client.write_event(AudioStart(rate=rate, width=2, channels=channels).event())
        step = int(rate * CHUNK_S) * 2 * channels
        for offset in range(0, len(audio), step):
            chunk = AudioChunk(rate=rate, width=2, channels=channels,
                               audio=audio[offset : offset + step])  # fmt: skip
            await client.write_event(chunk.event())
            if pace:
                await asyncio.sleep(pace)
        sent_stop_after = len(events)
        await client.write_event(AudioStop().event())
        await asyncio.wait_for(reader, 120)
    return events, sent_stop_after


def text_of(events: list[Event]) -> str:
    transcripts = [Transcript.from_event(e) for e in events if Transcript.is_type(e.type)]
    assert len(transcripts) == 1, [e.type for e in events]
    return transcripts[0].text


def test_describe_lists_the_models(server) -> None:
    async def go() -> Info:
        async with AsyncTcpClient("127.0.0.1", server[1]) as client:
            await client.write_event(Describe().event())
            return Info.from_event(await client.read_event())

    info = asyncio.run(go())
    (program,) = info.asr
    assert program.supports_transcript_streaming and program.installed
    assert program.requires_external_vad  # STT_WYOMING_ENDPOINTING=false
    assert [(m.name, m.languages, m.installed) for m in program.models] == [
        ("tiny.en", ["en"], True)
    ]


def test_jfk_streams_chunks_while_speaking_then_the_transcript(server) -> None:
    events, before_stop = asyncio.run(
        utterance(server[1], jfk(16000), 16000, pace=CHUNK_S / 3,
                  before=[Transcribe(name="tiny.en", language="en").event()])
    )  # fmt: skip
    kinds = [e.type for e in events]
    assert kinds[0] == TranscriptStart.from_event(events[0]).event().type
    assert kinds[-2:] == ["transcript", "transcript-stop"], kinds
    chunks = [TranscriptChunk.from_event(e).text for e in events if e.type == "transcript-chunk"]
    assert any(e.type == "transcript-chunk" for e in events[:before_stop]), (before_stop, kinds)
    assert normalise(text_of(events)) == normalise(JFK_TEXT)
    assert chunks and all(chunk.strip() for chunk in chunks)
    assert Transcript.from_event(events[-2]).language == "en"


def test_speech_after_a_pause_is_in_the_transcript(server) -> None:
    """The whole-utterance pass starts when the speaker pauses; speech after the pause must
    not be lost to it: jfk, 1.5 s of silence, jfk again -> both in the transcript."""
    audio = jfk(16000)
    silence = b"\0\0" * int(16000 * 1.5)
    events, _ = asyncio.run(utterance(server[1], audio + silence + audio, 16000, pace=CHUNK_S / 2))
    text = normalise(text_of(events))
    assert text.count("and so my fellow americans") == 2, text  # the second one too
    assert text.endswith("what you can do for your country"), text


def test_speech_after_a_pause_shorter_than_a_turn_end_is_in_the_transcript(server) -> None:
    """1089-134691-0001 pauses 0.2-0.5 s after "waiting" (a pause, not the end of the turn),
    then "but he could wait no longer": the pass started at that pause must be dropped when
    the speech comes back, not answer without the last words."""
    audio = jfk(16000, path=JFK_WAV.parent / "1089-134691-0001.flac")
    events, _ = asyncio.run(utterance(server[1], audio, 16000, pace=CHUNK_S))  # heard live
    text = normalise(text_of(events))
    assert text.startswith("for a full hour") and text.endswith("wait no longer"), text


def test_a_pause_before_the_stop_gives_the_same_transcript(server) -> None:
    """jfk then 1.5 s of silence (a client stops after hearing silence): the pass started at
    the pause is the transcript."""
    audio = jfk(16000) + b"\0\0" * int(16000 * 1.5)
    events, _ = asyncio.run(utterance(server[1], audio, 16000, pace=CHUNK_S))  # live
    assert normalise(text_of(events)) == normalise(JFK_TEXT)
    assert "the pass started at the pause answers" in server[0].log_tail()


def test_a_short_pause_before_the_stop_starts_the_pass_early(server) -> None:
    """jfk then 0.3 s of silence, at real-time pace: the pass starts after 0.2 s of silence
    (shorter than the live session's 0.5 s turn end), so it is the transcript."""
    audio = jfk(16000) + b"\0\0" * int(16000 * 0.3)
    seen = len(server[0].log_path.read_text(errors="replace").splitlines())
    events, _ = asyncio.run(utterance(server[1], audio, 16000, pace=CHUNK_S))
    assert normalise(text_of(events)) == normalise(JFK_TEXT)
    logged = server[0].log_path.read_text(errors="replace").splitlines()[seen:]
    assert any("the pass started at the pause answers" in line for line in logged), logged


@pytest.mark.parametrize(("rate", "channels"), [(8000, 1), (48000, 2)])
def test_other_rates_and_stereo(server, rate: int, channels: int) -> None:
    events, _ = asyncio.run(utterance(server[1], jfk(rate, channels), rate, channels))
    words = normalise(text_of(events)).split()
    expected = normalise(JFK_TEXT).split()
    assert len(set(words) & set(expected)) >= 0.9 * len(set(expected)), words


def test_two_clients_at_once(server) -> None:
    async def both() -> list[tuple[list[Event], int]]:
        audio = jfk(16000)
        return await asyncio.gather(utterance(server[1], audio, 16000),
                                    utterance(server[1], audio, 16000))  # fmt: skip

    for events, _ in asyncio.run(both()):
        assert normalise(text_of(events)) == normalise(JFK_TEXT)


async def exchange(port: int, events: list[Event], *, until_close: bool = False) -> list[Event]:
    """Send `events`, then read until the server has answered each (or closed)."""
    received: list[Event] = []
    async with AsyncTcpClient("127.0.0.1", port) as client:
        for event in events:
            await client.write_event(event)
        await client.write_event(Describe().event())  # answered last: all before it are in
        while (event := await asyncio.wait_for(client.read_event(), 30)) is not None:
            received.append(event)
            if Info.is_type(event.type) and not until_close:
                break
    return received


def errors(events: list[Event]) -> list[str | None]:
    return [Error.from_event(e).code for e in events if Error.is_type(e.type)]


def test_bad_events_get_errors_and_the_connection_goes_on(server) -> None:
    port = server[1]
    bad = [
        Event(type="no-such-event"),
        AudioChunk(rate=16000, width=2, channels=1, audio=b"\0\0" * 160).event(),
        AudioStop().event(),
        AudioStart(rate=16000, width=3, channels=1).event(),
        AudioStart(rate=1000, width=2, channels=1).event(),
        Transcribe(name="whisper-large-v9").event(),
        Transcribe(name="tiny.en", language="fr").event(),
    ]
    received = asyncio.run(exchange(port, bad))
    assert errors(received) == [
        "unknown_event", "no_audio_start", "no_audio_start", "unsupported_audio",
        "unsupported_audio", "model_not_found", "unsupported_language",
    ]  # fmt: skip
    assert Info.is_type(received[-1].type)  # still answering after all that
    # a chunk in another format than announced, and one that is not whole frames
    mixed = [
        AudioStart(rate=16000, width=2, channels=1).event(),
        AudioChunk(rate=8000, width=2, channels=1, audio=b"\0\0" * 80).event(),
        AudioChunk(rate=16000, width=2, channels=1, audio=b"\0\0\0").event(),
    ]
    assert errors(asyncio.run(exchange(port, mixed))) == ["audio_format_changed", "invalid_audio"]


def test_oversized_chunk_closes_the_connection(server) -> None:
    big = AudioChunk(rate=16000, width=2, channels=1, audio=b"\0" * (MAX_FRAME_KB * 1024 + 2))
    received = asyncio.run(
        exchange(server[1], [AudioStart(rate=16000, width=2, channels=1).event(), big.event()],
                 until_close=True)
    )  # fmt: skip
    assert errors(received) == ["message_too_large"]
    assert not any(Info.is_type(e.type) for e in received)  # closed before the describe


def test_a_client_still_sending_after_a_closing_error_reads_it_and_then_the_end(server) -> None:
    """The server closes after an oversized event without reading its payload; closing with
    bytes unread would reset the connection, which loses the error event or fails the client's
    next write. It half-closes and drops what the client still sends instead."""
    big = AudioChunk(rate=16000, width=2, channels=1, audio=b"\1" * (MAX_FRAME_KB * 1024 * 4))
    more = AudioChunk(rate=16000, width=2, channels=1, audio=b"\0\0" * 1600)

    async def run() -> tuple[Event | None, Event | None]:
        async with AsyncTcpClient("127.0.0.1", server[1]) as client:
            await client.write_event(big.event())
            error = await asyncio.wait_for(client.read_event(), 30)
            for _ in range(20):  # the server has closed its side: these still go through
                await client.write_event(more.event())
            end = await asyncio.wait_for(client.read_event(), 30)
        return error, end

    error, end = asyncio.run(run())
    assert error is not None and errors([error]) == ["message_too_large"]
    assert end is None  # the end of the stream, not a reset


def test_a_silent_client_is_dropped_and_others_go_on(server) -> None:
    async def silent() -> tuple[list[Event], float]:
        started = time.monotonic()
        async with AsyncTcpClient("127.0.0.1", server[1]) as client:
            await client.write_event(AudioStart(rate=16000, width=2, channels=1).event())
            received = []
            while (event := await asyncio.wait_for(client.read_event(), 30)) is not None:
                received.append(event)
        return received, time.monotonic() - started

    async def both() -> tuple[tuple[list[Event], float], tuple[list[Event], int]]:
        return await asyncio.gather(silent(), utterance(server[1], jfk(16000), 16000))

    (received, took), (other, _) = asyncio.run(both())
    assert [e.type for e in received][-1] == "error" and errors(received) == ["idle_timeout"]
    assert IDLE_S <= took < IDLE_S + 10
    assert normalise(text_of(other)) == normalise(JFK_TEXT)


def test_a_client_leaving_before_the_answer_is_quietly_dropped(server) -> None:
    """A client that sends audio-stop and leaves at once: the server writes into a closed
    connection; that ends the connection quietly and the next client is served."""

    async def leave() -> None:
        async with AsyncTcpClient("127.0.0.1", server[1]) as client:
            await client.write_event(AudioStart(rate=16000, width=2, channels=1).event())
            chunk = AudioChunk(rate=16000, width=2, channels=1, audio=jfk(16000)[:64000])
            await client.write_event(chunk.event())
            await client.write_event(AudioStop().event())

    asyncio.run(leave())
    events, _ = asyncio.run(utterance(server[1], jfk(16000), 16000))
    assert normalise(text_of(events)) == normalise(JFK_TEXT)
    assert "Task exception was never retrieved" not in server[0].log_tail(400)
    assert "Traceback" not in server[0].log_tail(400)


def test_clients_over_the_limit_are_turned_away(server) -> None:
    async def go() -> list[Event]:
        clients = [AsyncTcpClient("127.0.0.1", server[1]) for _ in range(MAX_CLIENTS + 1)]
        for client in clients[:MAX_CLIENTS]:
            await client.connect()
            await client.write_event(Describe().event())
            await client.read_event()  # connected and served
        extra = clients[MAX_CLIENTS]
        await extra.connect()
        received = []
        while (event := await asyncio.wait_for(extra.read_event(), 30)) is not None:
            received.append(event)
        for client in clients:
            await client.disconnect()
        return received

    assert errors(asyncio.run(go())) == ["busy"]


def test_utterances_over_the_live_session_limit_wait_until_one_ends(server) -> None:
    """An utterance is a live session of the server: with two in flight (STT_STREAM_MAX_SESSIONS)
    a third `audio-start` is refused (`too_many_sessions`, then the connection closes: retry);
    once one of the two ends, the next one is admitted."""
    start = AudioStart(rate=16000, width=2, channels=1).event()

    async def begin(client: AsyncTcpClient) -> list[Event]:
        """audio-start; the events until transcript-start, or an error and the close."""
        await client.write_event(start)
        received = []
        while (event := await asyncio.wait_for(client.read_event(), 30)) is not None:
            received.append(event)
            if TranscriptStart.is_type(event.type):
                break
        return received

    async def go() -> tuple[list[Event], list[Event]]:
        holders = [AsyncTcpClient("127.0.0.1", server[1]) for _ in range(MAX_SESSIONS)]
        for client in holders:
            await client.connect()
            assert [e.type for e in await begin(client)] == ["transcript-start"]
        async with AsyncTcpClient("127.0.0.1", server[1]) as third:
            refused = await begin(third)
        await holders[0].disconnect()  # its utterance ends with the connection
        admitted: list[Event] = []
        for _ in range(50):  # the server sees the disconnect within moments
            async with AsyncTcpClient("127.0.0.1", server[1]) as client:
                admitted = await begin(client)
            if admitted and TranscriptStart.is_type(admitted[-1].type):
                break
            await asyncio.sleep(0.1)
        await holders[1].disconnect()
        return refused, admitted

    refused, admitted = asyncio.run(go())
    assert errors(refused) == ["too_many_sessions"] and len(refused) == 1  # then closed
    assert [e.type for e in admitted] == ["transcript-start"]


def test_home_assistant_discovers_the_server_by_mdns(tmp_path: Path) -> None:
    """A server coming up announces the `_wyoming._tcp.local.` record Home Assistant browses
    for (the listener is up first, as Home Assistant's is), naming its address and port."""
    from zeroconf import IPVersion, ServiceStateChange
    from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo, AsyncZeroconf

    port = free_port()
    name = f"stt-test-{port}._wyoming._tcp.local."

    async def discover() -> AsyncServiceInfo:
        zc = AsyncZeroconf(ip_version=IPVersion.V4Only)
        seen = asyncio.Event()

        def on_change(zeroconf, service_type, name: str, state_change) -> None:
            if name.startswith(f"stt-test-{port}") and state_change is ServiceStateChange.Added:
                seen.set()

        browser = AsyncServiceBrowser(zc.zeroconf, "_wyoming._tcp.local.", handlers=[on_change])
        live = await asyncio.to_thread(
            start_server, tmp_path, "mdns", STT_WYOMING_PORT=str(port),
            STT_WYOMING_HOST="127.0.0.1", STT_WYOMING_ZEROCONF=f"stt-test-{port}",
        )  # fmt: skip
        try:
            await asyncio.wait_for(seen.wait(), 30)
            info = AsyncServiceInfo("_wyoming._tcp.local.", name)
            assert await info.async_request(zc.zeroconf, 5000)
            return info
        finally:
            await browser.async_cancel()
            await zc.async_close()
            await asyncio.to_thread(stop_server, live)

    info = asyncio.run(discover())
    assert info.port == port
    assert info.parsed_addresses() == ["127.0.0.1"]


def test_server_without_the_setting_has_no_wyoming_port(tmp_path: Path) -> None:
    """Off by default: the port the test would use stays closed."""
    port = free_port()
    live = start_server(tmp_path, "no-wyoming")
    try:

        async def connect() -> None:
            async with AsyncTcpClient("127.0.0.1", port) as client:
                await client.write_event(Describe().event())

        with pytest.raises(OSError):
            asyncio.run(connect())
    finally:
        stop_server(live)
