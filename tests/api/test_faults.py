"""Faults, each on its own uvicorn process: SIGTERM drains the requests in flight (up to
uvicorn's `--timeout-graceful-shutdown`) and exits 0; a model that fails to load leaves the
server up with /health 503 and the reason (no crash loop); clients that vanish mid-upload or
mid-stream free the worker at once.

test_strict_server.py covers a disconnect during a decode (plain and SSE); test_lifecycle.py the
load failures in process. Here: the real process, its signals and its log.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import shutil
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from tests.api.conftest import (
    JFK_TEXT,
    JFK_WAV,
    LONG_WAV,
    LiveServer,
    assert_openai_error,
    normalise,
    start_server,
    stop_server,
)
from tests.api.test_realtime import COMPLETED
from tests.api.test_stream_ws import load_pcm16, ws_url
from tests.conftest import model_dir

pytestmark = pytest.mark.timeout(300)

TRANSCRIBE = "/v1/audio/transcriptions"
# uvicorn (>= 0.29) re-raises the signal it caught once the shutdown is complete, so that
# supervisors see why it stopped: "killed by SIGTERM" (-15 here, 143 in a shell) is its clean exit.
CLEAN_EXIT = (0, -signal.SIGTERM)


def wait_for(predicate, timeout_s: float, what: str) -> float:  # type: ignore[no-untyped-def]
    """Poll `predicate` every 20 ms; seconds it took; fails after `timeout_s`."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if predicate():
            return time.monotonic() - t0
        time.sleep(0.02)
    pytest.fail(f"{what}: not within {timeout_s} s")


def pool_state(server: LiveServer) -> tuple[int, int]:
    """(running, queued) jobs from /health."""
    body = httpx.get(server.url("/health"), timeout=5).json()
    return body["active"], body["queued"]


def active_streams(server: LiveServer) -> float:
    """The `stt_active_streams` gauge from /metrics."""
    text = httpx.get(server.url("/metrics"), timeout=5).text
    line = next(x for x in text.splitlines() if x.startswith("stt_active_streams "))
    return float(line.split()[1])


def post_in_background(server: LiveServer, audio: bytes, results: list) -> threading.Thread:
    def go() -> None:
        try:
            results.append(
                httpx.post(
                    server.url(TRANSCRIBE),
                    files={"file": ("a.wav", audio, "audio/wav")},
                    timeout=180,
                )
            )
        except httpx.HTTPError as e:
            results.append(e)

    thread = threading.Thread(target=go)
    thread.start()
    return thread


# ---- SIGTERM ----------------------------------------------------------------------------------
def live_session_in_background(
    server: LiveServer, results: list, events: list | None = None
) -> threading.Thread:
    """A WebSocket session sending jfk at real-time pace; appends its close code to `results`
    and the events it received to `events`."""
    received = events if events is not None else []

    async def session() -> None:
        pcm = load_pcm16(JFK_WAV)
        async with connect(ws_url(server)) as ws:

            async def read() -> None:
                with contextlib.suppress(ConnectionClosed):
                    async for message in ws:
                        received.append(json.loads(message))

            reader = asyncio.create_task(read())
            with contextlib.suppress(ConnectionClosed):
                for offset in range(0, len(pcm), 3200):
                    await ws.send(pcm[offset : offset + 3200])
                    await asyncio.sleep(0.1)
                await ws.send('{"type": "session.close"}')
            await reader
        results.append(ws.close_code)

    thread = threading.Thread(target=asyncio.run, args=(session(),))
    thread.start()
    return thread


async def realtime_session(
    server: LiveServer, pcm: bytes, events: list, pause_s: float, then: Callable | None = None
) -> int | None:
    """A Realtime session (client commits; none is sent) that sends `pcm` (24 kHz) in 100 ms
    appends `pause_s` apart, then awaits `then(append, reader)` if given (`append(pcm)` sends
    one more append); collects the events until the close and returns its code."""
    url = server.base_url.replace("http://", "ws://") + "/v1/realtime?intent=transcription"
    async with connect(url) as ws:

        async def read() -> None:
            with contextlib.suppress(ConnectionClosed):
                async for message in ws:
                    events.append(json.loads(message))

        async def append(piece: bytes) -> None:
            audio = base64.b64encode(piece).decode()
            await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))

        reader = asyncio.create_task(read())
        update = {"type": "transcription", "audio": {"input": {"turn_detection": None}}}
        with contextlib.suppress(ConnectionClosed):
            await ws.send(json.dumps({"type": "session.update", "session": update}))
            for offset in range(0, len(pcm), 4800):
                await append(pcm[offset : offset + 4800])
                await asyncio.sleep(pause_s)
            if then is not None:
                await then(append, reader)
        await reader
    return ws.close_code


def realtime_session_in_background(
    server: LiveServer, results: list, events: list
) -> threading.Thread:
    """The same over the Realtime protocol, at real-time pace (no commit before the signal)."""

    def session() -> None:
        pcm = load_pcm16(JFK_WAV, 24000)
        results.append(asyncio.run(realtime_session(server, pcm, events, 0.1)))

    thread = threading.Thread(target=session)
    thread.start()
    return thread


async def refused_session(server: LiveServer) -> tuple[list[dict], int | None]:
    """Open a session and read until it closes: (error codes received, close code)."""
    errors = []
    async with connect(ws_url(server)) as ws:
        with contextlib.suppress(ConnectionClosed):
            async for message in ws:
                event = json.loads(message)
                if event["type"] == "error":
                    errors.append({"code": event["error"]["code"]})
    return errors, ws.close_code


def test_sigterm_drains_in_flight_requests(tmp_path: Path) -> None:
    """A running and a queued request both finish with 200 after SIGTERM; a live WebSocket
    session first gets its final text (transcript.text.done) and close 1001 (going away); a new
    session meanwhile is refused; then a clean exit."""
    server = start_server(
        tmp_path, "drain", uvicorn_args=["--timeout-graceful-shutdown", "60"], STT_WORKERS="1"
    )
    try:
        running: list = []
        queued: list = []
        closed: list = []
        events: list = []
        live = live_session_in_background(server, closed, events)
        realtime_closed: list = []
        realtime_events: list = []
        realtime = realtime_session_in_background(server, realtime_closed, realtime_events)
        wait_for(lambda: any(e["type"] == "transcript.text.partial" for e in events), 30,
                 "the live session transcribes")  # fmt: skip
        first = post_in_background(server, LONG_WAV.read_bytes(), running)
        wait_for(lambda: pool_state(server)[0] == 1, 30, "the long request runs")
        second = post_in_background(server, JFK_WAV.read_bytes(), queued)
        wait_for(lambda: pool_state(server)[1] >= 1, 30, "the second request waits")
        server.process.send_signal(signal.SIGTERM)
        sent_at = time.monotonic()
        time.sleep(0.3)
        late = asyncio.run(refused_session(server))
        first.join(120)
        second.join(120)
        live.join(60)
        realtime.join(60)
        code = server.process.wait(60)
        print(f"exited {time.monotonic() - sent_at:.2f} s after SIGTERM")
    finally:
        stop_server(server)
    assert isinstance(running[0], httpx.Response), running
    assert running[0].status_code == 200, running[0].text
    assert len(running[0].json()["text"].split()) > 60  # 60 s of speech, to the end
    assert isinstance(queued[0], httpx.Response), queued
    assert queued[0].status_code == 200, queued[0].text
    assert normalise(queued[0].json()["text"]) == normalise(JFK_TEXT)
    assert closed == [1001]
    done = [e for e in events if e["type"] == "transcript.text.done"]
    assert len(done) == 1, events
    # the audio received before the signal, transcribed (its last word may be cut off)
    assert normalise(done[0]["text"]).startswith("and so"), done
    assert late == ([{"code": "shutting_down"}], 1013), "a new session is refused while draining"
    # the Realtime session: the item being spoken is committed and completed, then 1001
    assert realtime_closed == [1001]
    kinds = [e["type"] for e in realtime_events]
    assert "input_audio_buffer.committed" in kinds, (realtime_closed, realtime_events)
    completed = [e for e in realtime_events if e["type"] == COMPLETED]
    assert len(completed) == 1 and normalise(completed[0]["transcript"]).startswith("and so")
    assert code in CLEAN_EXIT, server.log_tail()
    assert "Application shutdown complete" in server.log_tail()


def test_a_session_drained_at_shutdown_goes_on_answering_its_client(tmp_path: Path) -> None:
    """A Realtime client keeps sending until it sees the close, and its connection's keepalive
    wants pongs meanwhile. A drain whose last pass takes seconds (two minutes of audio sent in
    a burst before the signal) still reads the socket: the session gets its completed item and
    close 1001, not the keepalive's 1011 with the transcript lost."""
    server = start_server(
        tmp_path, "drain-read", uvicorn_args=["--ws-ping-interval", "0.25", "--ws-ping-timeout",
                                               "1"], STT_STREAM_MAX_BUFFERED_S="300",
    )  # fmt: skip
    events: list[dict] = []

    async def until_the_close(append: Callable, reader: asyncio.Task) -> None:
        server.process.send_signal(signal.SIGTERM)
        while not reader.done():  # a microphone goes on until the close
            await append(bytes(4800))
            await asyncio.sleep(0.02)

    # a burst (the client still answers the server's pings between appends)
    pcm = load_pcm16(LONG_WAV, 24000) * 2
    session = realtime_session(server, pcm, events, 0.001, until_the_close)
    try:
        closed = asyncio.run(asyncio.wait_for(session, 120))
        code = server.process.wait(60)
    finally:
        stop_server(server)
    completed = [e for e in events if e["type"] == COMPLETED]
    assert closed == 1001, (closed, server.log_tail())
    # the whole two minutes sent before the signal (the clip once is ~93 words)
    assert len(completed) == 1 and len(completed[0]["transcript"].split()) > 150, completed
    assert code in CLEAN_EXIT, server.log_tail()


def test_shutdown_delay_reports_draining_while_still_serving(tmp_path: Path) -> None:
    """With STT_SHUTDOWN_DELAY_S, SIGTERM first turns /health to 503 "draining" while requests
    are still served (a load balancer takes the replica out before it stops accepting); a new
    live session is refused with 1013 (reconnect elsewhere); then the process exits cleanly."""
    server = start_server(tmp_path, "delay", STT_SHUTDOWN_DELAY_S="4")
    try:
        assert httpx.get(server.url("/health"), timeout=5).status_code == 200
        server.process.send_signal(signal.SIGTERM)
        sent_at = time.monotonic()
        wait_for(
            lambda: httpx.get(server.url("/health"), timeout=5).status_code == 503,
            2,
            "/health turns 503",
        )
        health = httpx.get(server.url("/health"), timeout=5).json()
        served = httpx.post(
            server.url(TRANSCRIBE),
            files={"file": ("a.wav", JFK_WAV.read_bytes(), "audio/wav")},
            timeout=60,
        )
        served_after = time.monotonic() - sent_at
        refused = asyncio.run(refused_session(server))
        code = server.process.wait(60)
        took = time.monotonic() - sent_at
    finally:
        stop_server(server)
    assert health["status"] == "draining", health
    assert served.status_code == 200 and normalise(served.json()["text"]) == normalise(JFK_TEXT)
    assert served_after < 4, "the request was served inside the delay"
    assert refused == ([{"code": "shutting_down"}], 1013)
    assert 4 <= took < 20, took
    assert code in CLEAN_EXIT, server.log_tail()


def test_sigterm_grace_period_is_bounded(tmp_path: Path) -> None:
    """With a 1 s grace period, a long request is cut off and the process still exits cleanly,
    soon; no new connection is accepted after the signal."""
    server = start_server(
        tmp_path, "grace", uvicorn_args=["--timeout-graceful-shutdown", "1"], STT_WORKERS="1"
    )
    try:
        results: list = []
        thread = post_in_background(server, LONG_WAV.read_bytes(), results)
        wait_for(lambda: pool_state(server)[0] == 1, 30, "the long request runs")
        server.process.send_signal(signal.SIGTERM)
        sent_at = time.monotonic()
        time.sleep(0.3)
        port = int(server.base_url.rsplit(":", 1)[1])
        with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
            pass
        code = server.process.wait(60)
        took = time.monotonic() - sent_at
        thread.join(60)
    finally:
        stop_server(server)
    assert code in CLEAN_EXIT, server.log_tail()
    assert "Application shutdown complete" in server.log_tail()
    assert took < 15, f"exit took {took:.1f} s with a 1 s grace period"
    print(f"exited {took:.2f} s after SIGTERM; the client got {results[0]!r}")


# ---- a model that does not load ---------------------------------------------------------------
def broken_models_dir(root: Path) -> Path:
    """A models folder with `broken` (tiny.en's files, encoder.onnx overwritten with junk)."""
    broken = root / "broken"
    shutil.copytree(model_dir("tiny.en"), broken)
    (broken / "encoder.onnx").write_bytes(b"\x08\x07 not an onnx graph " * 100)
    return root


@pytest.mark.parametrize("model", ["broken", "no-such-model"])
def test_model_that_fails_to_load(tmp_path: Path, model: str) -> None:
    """The process stays up (no crash loop), /health is 503 with the reason, the log says it,
    requests get 503 model_load_failed; SIGTERM still exits cleanly."""
    models = broken_models_dir(tmp_path / "models")
    server = start_server(
        tmp_path, f"fail-{model}", expect_ready=False,
        STT_MODELS=model, STT_MODELS_DIR=str(models),
    )  # fmt: skip
    try:
        wait_for(
            lambda: httpx.get(server.url("/health"), timeout=5).json()["status"] == "failed",
            120,
            "/health reports the failure",
        )
        health = httpx.get(server.url("/health"), timeout=5)
        assert health.status_code == 503
        reason = health.json()["error"]
        assert model in reason, reason
        if model == "no-such-model":
            assert "make models" in reason and "broken" in reason, reason  # what is there
        r = httpx.post(server.url(TRANSCRIBE), files={"file": JFK_WAV.open("rb")}, timeout=30)
        error = assert_openai_error(r, 503)
        assert error["code"] == "model_load_failed" and model in error["message"]
        time.sleep(1.0)
        assert server.process.poll() is None, "the server exited: a crash loop under a supervisor"
        log = server.log_path.read_text()
        assert "ERROR" in log and model in log, log[-3000:]
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(30) in CLEAN_EXIT
    finally:
        stop_server(server)


# ---- clients that vanish ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def one_worker(tmp_path_factory: pytest.TempPathFactory) -> LiveServer:
    server = start_server(tmp_path_factory.mktemp("vanish"), "vanish", STT_WORKERS="1")
    yield server
    stop_server(server)


def test_disconnect_mid_upload_leaves_nothing_behind(one_worker: LiveServer) -> None:
    """Half a multipart body, then the socket closes: no job starts, the next request is served
    at once."""
    port = int(one_worker.base_url.rsplit(":", 1)[1])
    body = JFK_WAV.read_bytes()
    head = (
        f"POST {TRANSCRIBE} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: multipart/form-data; boundary=b0undary\r\n"
        f"Content-Length: {len(body) + 200}\r\n\r\n"
        '--b0undary\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n'
    ).encode()
    for _ in range(5):
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(head + body[: len(body) // 2])
            time.sleep(0.2)
    assert pool_state(one_worker) == (0, 0)
    r = httpx.post(one_worker.url(TRANSCRIBE), files={"file": JFK_WAV.open("rb")}, timeout=60)
    assert r.status_code == 200 and normalise(r.json()["text"]) == normalise(JFK_TEXT)


def test_disconnect_mid_stream_frees_the_worker(one_worker: LiveServer) -> None:
    """A WebSocket client that drops the TCP connection while its pass decodes: the pass is
    cancelled, the worker is free within a second, the session count goes back to 0."""
    flood = load_pcm16(LONG_WAV)  # 60 s of speech at once: passes over 30 s windows

    async def vanish() -> None:
        async with connect(ws_url(one_worker), max_size=None) as ws:
            await ws.recv()  # session.created
            for offset in range(0, len(flood), 32000):
                await ws.send(flood[offset : offset + 32000])
            await asyncio.to_thread(
                wait_for, lambda: pool_state(one_worker)[0] == 1, 30, "a pass runs"
            )
            assert await asyncio.to_thread(active_streams, one_worker) == 1
            ws.transport.abort()  # no close frame: the client just vanished

    asyncio.run(vanish())
    gone_at = time.monotonic()
    freed = wait_for(lambda: pool_state(one_worker) == (0, 0), 10, "the worker is free")
    print(f"worker free {freed:.3f} s after the client vanished")
    assert time.monotonic() - gone_at < 1.5, "the pass was not cancelled"
    wait_for(lambda: active_streams(one_worker) == 0, 5, "the session is closed")
    r = httpx.post(one_worker.url(TRANSCRIBE), files={"file": JFK_WAV.open("rb")}, timeout=60)
    assert r.status_code == 200
