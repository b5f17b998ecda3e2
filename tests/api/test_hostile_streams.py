"""Hostile WebSocket clients on the shared live server while a well-behaved session runs.

test_stream_ws.py covers each bad message and limit on its own (invalid JSON, unknown types,
odd-length PCM, oversized frames and the backlog limit on a server with small limits). Here they
all hit the default server at once, with what it did not cover: JSON that breaks the parser
(deep nesting, 5000-digit numbers, NaN), NaN float samples, a frame just over the default
STT_STREAM_MAX_FRAME_KB, and a flood of speech much faster than real time — and a concurrent
well-behaved session must still get the right transcript.
"""

from __future__ import annotations

import asyncio
import json
import struct

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.api.conftest import JFK_TEXT, JFK_WAV, LONG_WAV, LiveServer
from tests.api.test_stream_ws import (
    JFK_MAX_WER,
    StreamRun,
    assert_close,
    check_stream_invariants,
    load_pcm16,
    stream_audio,
    ws_url,
)

pytestmark = pytest.mark.timeout(300)

DEFAULT_MAX_FRAME = 1024 * 1024  # STT_STREAM_MAX_FRAME_KB default, in bytes
PARSER_BREAKERS = [
    ("[" * 5000, "invalid_json"),  # deeper than the JSON parser's recursion limit
    ('{"type": "session.close", "n": ' + "9" * 5000 + "}", "invalid_json"),  # int digit limit
    ('{"type": "session.update", "session": {"vad": {"threshold": NaN}}}', "invalid_json"),
    ("\x00\x01\x02 raw bytes sent as a text frame", "invalid_json"),
    (json.dumps({"type": "input_audio_buffer.append", "audio": 12}), "invalid_audio"),
    (json.dumps({"type": "session.update", "session": {"vad": {"threshold": 7}}}), "invalid_value"),
    (json.dumps({"type": "session.update", "session": ["x"]}), "invalid_value"),
    (json.dumps({"type": "response.create"}), "unknown_event"),
]


async def hostile_messages(url: str) -> StreamRun:
    """Parser breakers, then f32 audio with NaN samples and a 3-byte frame, then close."""
    nan_frame = struct.pack("<4f", 0.0, float("nan"), 0.1, 0.2)
    extra = [text for text, _ in PARSER_BREAKERS]
    extra.append(json.dumps({"type": "session.update", "session": {"encoding": "pcm_f32le"}}))
    extra += [nan_frame, b"\x00\x00\x80"]
    return await stream_audio(url, b"", speed=None, extra=extra)


async def oversized_frame(url: str) -> tuple[list[dict], int | None]:
    events: list[dict] = []
    async with connect(url, max_size=None) as ws:
        await ws.send(bytes(DEFAULT_MAX_FRAME + 2))  # one s16 sample over the limit
        try:
            async for message in ws:
                events.append(json.loads(message))
        except ConnectionClosed:
            pass
        return events, ws.close_code


@pytest.fixture(scope="module")
def results(server: LiveServer) -> dict[str, object]:
    """Everything at once: the good session at real-time pace and three hostile clients."""
    url = ws_url(server)
    flood = load_pcm16(LONG_WAV) * 3  # 3 x 60 s of speech, as fast as the socket takes it

    async def everything() -> dict[str, object]:
        good, hostile, big, flooded = await asyncio.gather(
            stream_audio(url, load_pcm16(JFK_WAV), chunk_s=0.1, speed=1.0),
            hostile_messages(url),
            oversized_frame(url),
            stream_audio(url, flood, chunk_s=1.0, speed=None),
        )
        return {"good": good, "hostile": hostile, "big": big, "flood": flooded}

    return asyncio.run(everything())


def test_well_behaved_session_is_unaffected(results: dict) -> None:
    good: StreamRun = results["good"]
    check_stream_invariants(good)
    assert_close(good.done_text, JFK_TEXT, JFK_MAX_WER)


def test_bad_messages_get_error_events_and_the_session_goes_on(results: dict) -> None:
    run: StreamRun = results["hostile"]
    errors = [e["error"] for e in run.of("error")]
    expected = [code for _, code in PARSER_BREAKERS] + ["invalid_audio", "invalid_audio"]
    assert [e["code"] for e in errors] == expected, errors
    for error in errors:
        assert set(error) == {"message", "type", "param", "code"} and error["message"]
        assert error["type"] == "invalid_request_error"  # the client's fault, never internal
    assert "NaN" in errors[-2]["message"]
    assert run.close_code == 1000 and run.done_text == ""


def test_oversized_frame_closes_1009(results: dict) -> None:
    events, code = results["big"]
    assert code == 1009
    assert [e["type"] for e in events] == ["session.created", "error"]
    assert events[-1]["error"]["code"] == "message_too_large"


def test_flood_is_cut_off_with_buffer_overflow(results: dict) -> None:
    flood: StreamRun = results["flood"]
    assert flood.close_code == 1008
    assert [e["error"]["code"] for e in flood.of("error")] == ["buffer_overflow"]


def test_server_idle_and_healthy_afterwards(server: LiveServer, results: dict) -> None:
    health = httpx.get(server.url("/health"), timeout=10)
    assert health.status_code == 200
    deadline = asyncio.run(_until_idle(server))
    assert deadline, "jobs still running or queued after every session closed"
    metrics = httpx.get(server.url("/metrics"), timeout=10).text
    assert "stt_active_streams 0.0" in metrics


async def _until_idle(server: LiveServer, timeout_s: float = 10.0) -> bool:
    async with httpx.AsyncClient(timeout=5) as client:
        for _ in range(int(timeout_s / 0.1)):
            body = (await client.get(server.url("/health"))).json()
            if body["active"] == 0 and body["queued"] == 0:
                return True
            await asyncio.sleep(0.1)
    return False
