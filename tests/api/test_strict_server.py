"""A server with an API key, one worker, no wait queue, 3 MB uploads and 90 s of audio:
auth (401), limits (413), a full queue (429 + Retry-After) and cancellation on disconnect."""

from __future__ import annotations

import io
import re
import threading
import time

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf

from tests.api.conftest import (
    JFK_TEXT,
    JFK_WAV,
    LONG_WAV,
    STRICT_KEY,
    LiveServer,
    assert_openai_error,
    normalise,
)

pytestmark = pytest.mark.timeout(300)

TRANSCRIBE = "/v1/audio/transcriptions"


def jfk_file() -> dict:
    return {"file": ("jfk.wav", JFK_WAV.read_bytes(), "audio/wav")}


def metric(server: LiveServer, name: str, **labels: str) -> float:
    """Current value of one sample from /metrics (0 if absent)."""
    text = httpx.get(server.url("/metrics"), headers=server.auth, timeout=10).text
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = re.fullmatch(r"([a-zA-Z_:]+)(\{(.*)\})? (\S+)", line)
        if not m or m.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', m.group(3) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(m.group(4))
    return 0.0


def wait_idle(server: LiveServer, timeout: float) -> float:
    """Seconds until no job is running or queued; fails after `timeout`."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        health = httpx.get(server.url("/health"), timeout=5).json()
        if health["active"] == 0 and health["queued"] == 0:
            return time.perf_counter() - t0
        time.sleep(0.02)
    pytest.fail(f"server still busy after {timeout} s")


# ---- auth ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/v1/models"), ("GET", "/v1/models/tiny.en"), ("GET", "/metrics"),
     ("POST", TRANSCRIBE), ("POST", "/v1/audio/translations")],
)  # fmt: skip
def test_key_required_everywhere_but_health(
    strict_server: LiveServer, method: str, path: str
) -> None:
    kwargs = {"files": jfk_file()} if method == "POST" else {}
    url = strict_server.url(path)
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": STRICT_KEY}):
        r = httpx.request(method, url, headers=headers, timeout=60, **kwargs)
        error = assert_openai_error(r, 401)
        assert error["code"] == "invalid_api_key"
        assert r.headers["www-authenticate"] == "Bearer"
    r = httpx.request(method, url, headers=strict_server.auth, timeout=60, **kwargs)
    assert r.status_code == 200, r.text


def test_health_needs_no_key(strict_server: LiveServer) -> None:
    assert httpx.get(strict_server.url("/health")).status_code == 200


def test_sdk_with_key(strict_server: LiveServer) -> None:
    good = openai.OpenAI(base_url=strict_server.url("/v1"), api_key=STRICT_KEY, max_retries=0)
    with JFK_WAV.open("rb") as f:
        assert normalise(good.audio.transcriptions.create(model="tiny.en", file=f).text) == (
            normalise(JFK_TEXT)
        )
    bad = openai.OpenAI(base_url=strict_server.url("/v1"), api_key="nope", max_retries=0)
    with JFK_WAV.open("rb") as f, pytest.raises(openai.AuthenticationError):
        bad.audio.transcriptions.create(model="tiny.en", file=f)


# ---- limits --------------------------------------------------------------------------------
def test_upload_too_large_is_413(strict_server: LiveServer) -> None:
    big = b"\x00" * (4 * 1024 * 1024)  # over the 3 MB limit
    r = httpx.post(
        strict_server.url(TRANSCRIBE),
        headers=strict_server.auth,
        files={"file": ("big.wav", big, "audio/wav")},
        timeout=60,
    )
    error = assert_openai_error(r, 413)
    assert "3 MB" in error["message"]


def test_upload_too_large_chunked_is_413(strict_server: LiveServer) -> None:
    """Without a Content-Length the limit still holds, counted while reading."""
    boundary = "xyzzy"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
        "Content-Type: audio/wav\r\n\r\n"
    ).encode()

    def body():
        yield head
        for _ in range(64):  # 64 x 64 KiB = 4 MiB
            yield b"\x01" * 65536
        yield f"\r\n--{boundary}--\r\n".encode()

    headers = {**strict_server.auth, "Content-Type": f"multipart/form-data; boundary={boundary}"}
    try:
        r = httpx.post(strict_server.url(TRANSCRIBE), headers=headers, content=body(), timeout=60)
    except httpx.TransportError:
        pytest.fail("the server dropped the connection instead of answering 413")
    assert_openai_error(r, 413)


def test_audio_too_long_is_413(strict_server: LiveServer) -> None:
    buffer = io.BytesIO()
    sf.write(buffer, np.zeros(100 * 16000, dtype=np.float32), 16000, format="FLAC")
    assert buffer.tell() < 1024 * 1024  # small upload, long audio
    r = httpx.post(
        strict_server.url(TRANSCRIBE),
        headers=strict_server.auth,
        files={"file": ("long.flac", buffer.getvalue(), "audio/flac")},
        timeout=60,
    )
    error = assert_openai_error(r, 413, param="file")
    assert error["code"] == "audio_too_long"
    assert "90" in error["message"]


# ---- queue + cancellation --------------------------------------------------------------------
def test_full_queue_is_429_and_disconnect_cancels(strict_server: LiveServer) -> None:
    """One worker, no queue: while a long stream decodes, the next request gets 429; closing
    the stream stops its decode (the worker is free long before the decode would have ended)."""
    wait_idle(strict_server, 30)
    cancelled_before = metric(strict_server, "stt_transcriptions_total", outcome="cancelled")
    ok_before = metric(strict_server, "stt_transcriptions_total", outcome="ok")
    with (
        httpx.Client(timeout=120) as client,
        client.stream(
            "POST",
            strict_server.url(TRANSCRIBE),
            headers=strict_server.auth,
            files={"file": ("long.wav", LONG_WAV.read_bytes(), "audio/wav")},
            data={"stream": "true"},
        ) as stream,
    ):
        assert stream.status_code == 200
        lines = stream.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert "transcript.text.delta" in first  # the job is now running

        r = httpx.post(
            strict_server.url(TRANSCRIBE), headers=strict_server.auth, files=jfk_file(), timeout=30
        )
        error = assert_openai_error(r, 429)
        assert error["type"] == "rate_limit_error"
        assert int(r.headers["retry-after"]) >= 1

        sdk = openai.OpenAI(base_url=strict_server.url("/v1"), api_key=STRICT_KEY, max_retries=0)
        with JFK_WAV.open("rb") as f, pytest.raises(openai.RateLimitError):
            sdk.audio.transcriptions.create(model="tiny.en", file=f)
        assert metric(strict_server, "stt_active_jobs") == 1
        assert metric(strict_server, "stt_active_streams") == 1
        closed_at = time.perf_counter()
    # Leaving the block closed the connection mid-stream.
    freed_after = wait_idle(strict_server, 30)
    print(f"worker free {freed_after:.3f} s after the disconnect")
    assert time.perf_counter() - closed_at < 1.5, "the decode was not cancelled"
    assert metric(strict_server, "stt_transcriptions_total", outcome="cancelled") == (
        cancelled_before + 1
    )
    assert metric(strict_server, "stt_transcriptions_total", outcome="ok") == ok_before
    assert metric(strict_server, "stt_active_streams") == 0
    # and the server is fine afterwards
    r = httpx.post(
        strict_server.url(TRANSCRIBE), headers=strict_server.auth, files=jfk_file(), timeout=60
    )
    assert r.status_code == 200, r.text


def test_disconnect_cancels_a_plain_request(strict_server: LiveServer) -> None:
    wait_idle(strict_server, 30)
    cancelled_before = metric(strict_server, "stt_transcriptions_total", outcome="cancelled")
    audio = LONG_WAV.read_bytes()
    errors: list[Exception] = []

    def client_that_gives_up() -> None:
        try:
            httpx.post(
                strict_server.url(TRANSCRIBE),
                headers=strict_server.auth,
                files={"file": ("long.wav", audio, "audio/wav")},
                timeout=httpx.Timeout(30, read=0.6),
            )
        except httpx.ReadTimeout as e:
            errors.append(e)

    thread = threading.Thread(target=client_that_gives_up)
    thread.start()
    thread.join()
    assert errors, "the request finished before the client gave up"
    gave_up = time.perf_counter()
    wait_idle(strict_server, 30)
    assert time.perf_counter() - gave_up < 1.5, "the decode was not cancelled"
    assert metric(strict_server, "stt_transcriptions_total", outcome="cancelled") == (
        cancelled_before + 1
    )
