"""Live transcription over `GET /v1/audio/stream` against a real uvicorn server (tiny.en),
with a real WebSocket client (`websockets`) sending the test clips in real-time-sized chunks.

The streamed text is compared with the REST result of the same greedy decoder (beam 1), after
normalisation (lower case, no punctuation), within a small word error rate rather than exactly:
the stream decodes other cuts of the audio than the REST path's 30 s windows (a pass starts where
the VAD found speech or where a committed segment ended, and ends where the audio received so
far ends), and tiny.en changes single words with such shifts. Measured: the window [0.05, 4.62] s
of jfk.wav gives "asked not", [0.0, 4.62] s gives "ask not" (greedy and beam 5 alike). Hence one
word of 22 may differ on jfk (JFK_MAX_WER), and STREAM_VS_REST_MAX_WER on the 60 s clip.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import jiwer
import numpy as np
import pytest
import soxr
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.api.conftest import (
    AUDIO,
    JFK_TEXT,
    JFK_WAV,
    LONG_WAV,
    LiveServer,
    normalise,
    start_server,
    stop_server,
)

pytestmark = pytest.mark.timeout(600)

LIMITS_KEY = "stream-key-123"
STREAM_VS_REST_MAX_WER = 0.10  # earnings clip, normalised words, stream vs REST (both greedy)
JFK_MAX_WER = 0.05  # one word of 22
EMPTY_WAV = AUDIO / "picovoice_empty.wav"


def load_pcm16(path, rate: int = 16000) -> bytes:
    """The clip as mono pcm_s16le at `rate`."""
    import soundfile as sf

    audio, sr = sf.read(str(path), dtype="float32", always_2d=True)
    audio = audio.mean(axis=1)
    if sr != rate:
        audio = soxr.resample(audio, sr, rate)
    return (np.clip(audio, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


def ws_url(server: LiveServer, query: str = "") -> str:
    return server.base_url.replace("http://", "ws://") + "/v1/audio/stream" + query


@dataclass
class StreamRun:
    events: list[tuple[float, dict[str, Any]]] = field(default_factory=list)  # (t, event)
    audio_end_t: float = 0.0  # monotonic time the last audio frame was sent
    close_code: int | None = None

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for _, e in self.events if e["type"] == kind]

    @property
    def done_text(self) -> str | None:
        done = self.of("transcript.text.done")
        return done[-1]["text"] if done else None

    def first_time(self, kind: str) -> float | None:
        return next((t for t, e in self.events if e["type"] == kind), None)


async def stream_audio(
    url: str,
    pcm: bytes,
    *,
    session: dict[str, Any] | None = None,
    chunk_s: float = 0.1,
    speed: float | None = 1.0,
    sample_rate: int = 16000,
    bytes_per_sample: int = 2,
    headers: dict[str, str] | None = None,
    as_base64: bool = False,
    extra: list[Any] | None = None,
) -> StreamRun:
    """Send `pcm` in `chunk_s` frames at `speed` x real time (None: as fast as possible), then
    session.close; collect every event until the server closes."""
    run = StreamRun()
    async with connect(url, additional_headers=headers, max_size=None) as ws:

        async def receive() -> None:
            try:
                async for message in ws:
                    run.events.append((time.monotonic(), json.loads(message)))
            except ConnectionClosed:
                pass

        receiver = asyncio.create_task(receive())
        try:
            if session is not None:
                await ws.send(json.dumps({"type": "session.update", "session": session}))
            for item in extra or []:
                await ws.send(item)
            step = int(chunk_s * sample_rate) * bytes_per_sample
            t0 = time.monotonic()
            for i, offset in enumerate(range(0, len(pcm), step)):
                frame = pcm[offset : offset + step]
                if as_base64:
                    encoded = base64.b64encode(frame).decode()
                    await ws.send(
                        json.dumps({"type": "input_audio_buffer.append", "audio": encoded})
                    )
                else:
                    await ws.send(frame)
                if speed:
                    delay = t0 + (i + 1) * chunk_s / speed - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
            run.audio_end_t = time.monotonic()
            await ws.send(json.dumps({"type": "session.close"}))
        except ConnectionClosed:  # the server closed first (a limit): keep what it sent
            pass
        await asyncio.wait_for(receiver, timeout=300)
        run.close_code = ws.close_code
    return run


def rest_text(server: LiveServer, path, **fields: str) -> str:
    with path.open("rb") as f:
        r = httpx.post(
            server.url("/v1/audio/transcriptions"),
            files={"file": (path.name, f)},
            data={"model": "tiny.en", "beam_size": "1", **fields},
            headers=server.auth,
            timeout=300,
        )
    assert r.status_code == 200, r.text
    return r.json()["text"]


def assert_close(text: str | None, expected: str, max_wer: float) -> None:
    """`text` equals `expected` after normalisation, up to a word error rate of `max_wer`."""
    assert text is not None, "no transcript.text.done"
    wer = jiwer.wer(normalise(expected), normalise(text))
    assert wer <= max_wer, (wer, text, expected)


def check_stream_invariants(run: StreamRun) -> None:
    """Deltas are append-only and add up to the final text; times never go back."""
    assert run.close_code == 1000, run.events[-3:]
    assert run.of("session.created"), "no session.created"
    assert not run.of("error"), run.of("error")
    deltas = run.of("transcript.text.delta")
    assert "".join(d["delta"] for d in deltas).strip() == run.done_text
    last_end = 0.0
    for d in deltas:
        assert d["start"] <= d["end"], d
        assert d["start"] >= last_end - 1e-6, (d, last_end)
        last_end = d["end"]
    segments = [s["segment"] for s in run.of("transcript.segment")]
    assert " ".join(s["text"] for s in segments).split() == run.done_text.split()


# ---- transcripts ------------------------------------------------------------------------------
def test_jfk_realtime_matches_rest(server: LiveServer) -> None:
    pcm = load_pcm16(JFK_WAV)
    run = asyncio.run(stream_audio(ws_url(server), pcm, chunk_s=0.1, speed=1.0))
    check_stream_invariants(run)
    rest = rest_text(server, JFK_WAV)
    assert normalise(rest) == normalise(JFK_TEXT)
    assert_close(run.done_text, rest, JFK_MAX_WER)
    assert run.of("transcript.text.done")[-1]["languages"] == [{"code": "en"}]
    # partial text is shown while the audio is still coming in
    first_partial = run.first_time("transcript.text.partial")
    first_delta = run.first_time("transcript.text.delta")
    assert first_partial is not None and first_partial < run.audio_end_t - 3.0
    assert first_delta is not None and first_delta < run.audio_end_t
    partial_texts = [p["text"] for p in run.of("transcript.text.partial") if p["text"].strip()]
    assert len(partial_texts) >= 5  # token by token, not one per pass


def speech_at(pcm: bytes, t: float, window_s: float = 0.1, within_db: float = 20.0) -> bool:
    """Whether the 16 kHz PCM16 audio has speech-level sound within `window_s` after `t`."""
    audio = np.frombuffer(pcm, np.int16).astype(np.float32)
    frames = audio[: len(audio) // 160 * 160].reshape(-1, 160)
    level = 10 * np.log10((frames**2).mean(axis=1) + 1e-9)
    first = int(t * 100)
    return bool((level[first : first + int(window_s * 100) + 1] > level.max() - within_db).any())


def test_measured_word_times(server: LiveServer) -> None:
    """`word_timestamps: true`: each delta after the first starts where speech is (its first
    word's measured start; jfk pauses 1 s after "Americans"). The first word of a stream starts
    at the path's start (the alignment's known limit, as in openai/whisper)."""
    pcm = load_pcm16(JFK_WAV)
    run = asyncio.run(
        stream_audio(ws_url(server), pcm, session={"word_timestamps": True}, speed=None)
    )
    check_stream_invariants(run)
    deltas = run.of("transcript.text.delta")
    assert len(deltas) >= 2
    assert all(speech_at(pcm, d["start"]) for d in deltas[1:]), deltas


def test_long_clip_faster_than_realtime(server: LiveServer) -> None:
    """60 s at 2x real time, sent as 48 kHz pcm_f32le in base64 events: the server resamples,
    coalesces passes and keeps up; the text is close to the REST result. (At 4x the full suite
    once gave 10.75 % against the 10 % bound on this 2-core machine: AlignAtt commits on audio
    that arrives in bursts are a #19 finding; this test is about resampling and keeping up.)"""
    import soundfile as sf

    audio, sr = sf.read(str(LONG_WAV), dtype="float32")
    audio48 = soxr.resample(audio, sr, 48000).astype("<f4")
    run = asyncio.run(
        stream_audio(
            ws_url(server),
            audio48.tobytes(),
            session={"sample_rate": 48000, "encoding": "pcm_f32le"},
            chunk_s=0.25,
            speed=2.0,
            sample_rate=48000,
            bytes_per_sample=4,
            as_base64=True,
        )
    )
    check_stream_invariants(run)
    rest = rest_text(server, LONG_WAV)
    wer = jiwer.wer(normalise(rest), normalise(run.done_text))
    assert wer <= STREAM_VS_REST_MAX_WER, (wer, run.done_text, rest)
    # committed along the way, not all at the end
    early = [
        t for t, e in run.events if e["type"] == "transcript.text.delta" and t < run.audio_end_t
    ]
    assert len(early) >= 3, run.of("transcript.text.delta")


@pytest.mark.parametrize("source", ["picovoice_empty", "zeros"])
def test_silence_yields_no_text(server: LiveServer, source: str) -> None:
    pcm = load_pcm16(EMPTY_WAV) if source == "picovoice_empty" else bytes(2 * 16000 * 6)
    run = asyncio.run(stream_audio(ws_url(server), pcm, chunk_s=0.2, speed=4.0))
    assert run.close_code == 1000
    assert run.done_text == ""
    assert run.of("transcript.text.delta") == []
    assert all(not p["text"].strip() for p in run.of("transcript.text.partial"))


@pytest.mark.cpu_kind
def test_two_sessions_stay_independent(server: LiveServer) -> None:
    other = AUDIO / "1089-134686-0000.flac"

    async def both() -> tuple[StreamRun, StreamRun]:
        return await asyncio.gather(
            stream_audio(ws_url(server), load_pcm16(JFK_WAV), chunk_s=0.1, speed=1.0),
            stream_audio(ws_url(server), load_pcm16(other), chunk_s=0.1, speed=1.0),
        )

    jfk, stew = asyncio.run(both())
    check_stream_invariants(jfk)
    check_stream_invariants(stew)
    assert_close(jfk.done_text, JFK_TEXT, JFK_MAX_WER)
    assert "stew for dinner" in normalise(stew.done_text)
    assert "country" not in normalise(stew.done_text)
    assert "dinner" not in normalise(jfk.done_text)


def test_commit_finalizes_and_session_goes_on(server: LiveServer) -> None:
    """input_audio_buffer.commit finalizes what was sent; later audio continues the text
    (48 kHz: the server's resampler carries on across the commit)."""
    pcm = load_pcm16(JFK_WAV, rate=48000)
    half = int(4.8 * 48000) * 2  # in the pause after "ask not"
    frame = 9600  # 100 ms

    async def go() -> StreamRun:
        run = StreamRun()
        async with connect(ws_url(server)) as ws:
            update = {"type": "session.update", "session": {"sample_rate": 48000}}
            await ws.send(json.dumps(update))
            for off in range(0, half, frame):
                await ws.send(pcm[off : off + frame])
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            deadline = time.monotonic() + 60
            text = ""
            while "fellow americans" not in normalise(text) and time.monotonic() < deadline:
                event = json.loads(await asyncio.wait_for(ws.recv(), 60))
                run.events.append((time.monotonic(), event))
                if event["type"] == "transcript.text.delta":
                    text += event["delta"]
            for off in range(half, len(pcm), frame):
                await ws.send(pcm[off : off + frame])
            await ws.send(json.dumps({"type": "session.close"}))
            async for message in ws:
                run.events.append((time.monotonic(), json.loads(message)))
            run.close_code = ws.close_code
        return run

    run = asyncio.run(go())
    check_stream_invariants(run)
    assert_close(run.done_text, JFK_TEXT, JFK_MAX_WER)


# ---- bad input --------------------------------------------------------------------------------
def test_malformed_messages_get_error_events(server: LiveServer) -> None:
    bad = [
        "this is not json",
        json.dumps(["not", "an", "object"]),
        json.dumps({"type": "no.such.event"}),
        json.dumps({"type": "input_audio_buffer.append", "audio": "%%% not base64 %%%"}),
        json.dumps({"type": "session.update", "session": {"encoding": "mp3"}}),
        json.dumps({"type": "session.update", "session": {"sample_rate": 12}}),
        json.dumps({"type": "session.update", "session": {"language": "de"}}),  # tiny.en
        json.dumps({"type": "session.update", "session": {"model": "no-such-model"}}),
        b"\x01\x02\x03",  # 3 bytes: not whole s16 samples
    ]
    pcm = load_pcm16(JFK_WAV)
    run = asyncio.run(stream_audio(ws_url(server), pcm, chunk_s=0.5, speed=None, extra=bad))
    errors = [e["error"] for e in run.of("error")]
    codes = [e["code"] for e in errors]
    assert codes == [
        "invalid_json",
        "invalid_event",
        "unknown_event",
        "invalid_audio",
        "invalid_value",
        "invalid_value",
        "unsupported_language",
        "model_not_found",
        "invalid_audio",
    ], errors
    for error in errors:
        assert set(error) == {"message", "type", "param", "code"} and error["message"]
    # ... and the session went on: the audio after the bad frames was transcribed
    assert run.close_code == 1000
    assert_close(run.done_text, JFK_TEXT, JFK_MAX_WER)


def test_session_update_after_audio_is_refused(server: LiveServer) -> None:
    late = json.dumps({"type": "session.update", "session": {"sample_rate": 8000}})

    async def go() -> StreamRun:
        run = StreamRun()
        async with connect(ws_url(server)) as ws:
            await ws.send(bytes(3200))
            await ws.send(late)
            await ws.send(json.dumps({"type": "session.close"}))
            async for message in ws:
                run.events.append((time.monotonic(), json.loads(message)))
            run.close_code = ws.close_code
        return run

    run = asyncio.run(go())
    assert [e["error"]["code"] for e in run.of("error")] == ["session_started"]
    assert run.close_code == 1000 and run.done_text == ""


# ---- limits and auth (own server: API key and small limits) -----------------------------------
@pytest.fixture(scope="module")
def limits_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = start_server(
        tmp_path_factory.mktemp("stream-limits"),
        "stream-limits",
        STT_API_KEY=LIMITS_KEY,
        STT_STREAM_IDLE_TIMEOUT_S="1.5",
        STT_STREAM_MAX_SESSION_S="60",
        STT_STREAM_MAX_BUFFERED_S="15",
        STT_STREAM_MAX_FRAME_KB="64",
        STT_STREAM_MAX_SESSIONS="2",
    )
    yield live
    stop_server(live)


async def first_events(url: str, n: int, **kwargs: Any) -> tuple[list[dict], int | None]:
    """Connect, read up to `n` events (or until closed); (events, close code)."""
    events: list[dict] = []
    async with connect(url, **kwargs) as ws:
        try:
            while len(events) < n:
                events.append(json.loads(await asyncio.wait_for(ws.recv(), 30)))
        except ConnectionClosed:
            pass
        code = ws.close_code
    return events, code


def test_auth_required(limits_server: LiveServer) -> None:
    url = ws_url(limits_server)
    events, code = asyncio.run(first_events(url, 2))
    assert code == 1008 and events[0]["type"] == "error"
    assert events[0]["error"]["code"] == "invalid_api_key"
    events, code = asyncio.run(first_events(url + "?api_key=wrong", 2))
    assert code == 1008 and events[0]["error"]["code"] == "invalid_api_key"
    # Bearer header, query parameter (browsers), subprotocol: all accepted
    bearer = {"additional_headers": {"Authorization": f"Bearer {LIMITS_KEY}"}}
    assert asyncio.run(first_events(url, 1, **bearer))[0][0]["type"] == "session.created"
    assert asyncio.run(first_events(url + f"?api_key={LIMITS_KEY}", 1))[0][0]["type"] == (
        "session.created"
    )
    proto = {"subprotocols": ["stt", f"openai-insecure-api-key.{LIMITS_KEY}"]}
    assert asyncio.run(first_events(url, 1, **proto))[0][0]["type"] == "session.created"


def _authed(server: LiveServer) -> str:
    return ws_url(server, f"?api_key={LIMITS_KEY}")


def test_idle_timeout_closes_with_policy_code(limits_server: LiveServer) -> None:
    t0 = time.monotonic()
    events, code = asyncio.run(first_events(_authed(limits_server), 5))
    assert code == 1008, events
    assert [e["type"] for e in events] == ["session.created", "error"]
    assert events[1]["error"]["code"] == "idle_timeout"
    assert 1.0 < time.monotonic() - t0 < 15


def test_frame_too_large_closes_1009(limits_server: LiveServer) -> None:
    async def go() -> tuple[list[dict], int | None]:
        events: list[dict] = []
        async with connect(_authed(limits_server), max_size=None) as ws:
            await ws.send(bytes(100 * 1024))
            try:
                async for message in ws:
                    events.append(json.loads(message))
            except ConnectionClosed:
                pass
            return events, ws.close_code

    events, code = asyncio.run(go())
    assert code == 1009
    assert events[-1]["error"]["code"] == "message_too_large"


def test_session_length_limit(limits_server: LiveServer) -> None:
    run = asyncio.run(
        stream_audio(_authed(limits_server), bytes(2 * 16000 * 70), chunk_s=1.0, speed=8.0)
    )
    assert run.close_code == 1008
    assert [e["error"]["code"] for e in run.of("error")] == ["session_too_long"]


def test_backlog_limit(limits_server: LiveServer) -> None:
    """Speech sent much faster than it can be transcribed: at most one 30 s window is buffered,
    the rest waits; beyond 15 s waiting -> 1008."""
    pcm = load_pcm16(LONG_WAV)[: 2 * 16000 * 50]
    run = asyncio.run(stream_audio(_authed(limits_server), pcm, chunk_s=1.0, speed=None))
    assert run.close_code == 1008
    assert [e["error"]["code"] for e in run.of("error")] == ["buffer_overflow"]


def test_session_count_limit(limits_server: LiveServer) -> None:
    async def go() -> tuple[list[dict], int | None]:
        url = _authed(limits_server)
        async with connect(url) as a, connect(url) as b:
            await a.recv()
            await b.recv()
            return await first_events(url, 2)

    events, code = asyncio.run(go())
    assert code == 1013
    assert events[0]["error"]["code"] == "too_many_sessions"


def test_session_update_is_applied_and_echoed(server: LiveServer) -> None:
    update = {
        "model": "tiny.en",
        "language": "en",
        "sample_rate": 8000,
        "encoding": "pcm_f32le",
        "prompt": "Kennedy",
        "vad": {"threshold": 0.6, "silence_duration_ms": 300, "prefix_padding_ms": 500},
    }
    bad_vad = json.dumps({"type": "session.update", "session": {"vad": {"bogus": 1}}})

    async def go() -> list[dict]:
        async with connect(ws_url(server)) as ws:
            await ws.send(json.dumps({"type": "session.update", "session": update}))
            await ws.send(bad_vad)
            events = [json.loads(await asyncio.wait_for(ws.recv(), 30)) for _ in range(3)]
            await ws.send(json.dumps({"type": "session.close"}))
            events += [json.loads(m) async for m in ws]
            return events

    events = asyncio.run(go())
    created, updated, error = events[:3]
    assert created["type"] == "session.created" and created["session"]["sample_rate"] == 16000
    assert updated["type"] == "session.updated"
    assert {k: updated["session"][k] for k in update} == {**update, "vad": True}
    assert error["type"] == "error" and error["error"]["param"] == "session.vad.bogus"
    assert events[-1] == {"type": "transcript.text.done", "text": "", "languages": []}
