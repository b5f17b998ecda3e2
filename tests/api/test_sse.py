"""Raw SSE over httpx: wire format, event order, and that tokens leave while decoding runs."""

from __future__ import annotations

import functools
import io
import itertools
import json
import time

import httpx
import numpy as np
import pytest
import soundfile as sf

from tests.api.conftest import JFK_TEXT, JFK_WAV, LONG_WAV, LiveServer, normalise

pytestmark = pytest.mark.timeout(300)


def read_events(
    server: LiveServer, path: str, audio: bytes, **fields: str
) -> tuple[httpx.Response, list[tuple[float, dict]]]:
    """POST with stream=true; returns the response and (arrival time s, event) pairs."""
    events: list[tuple[float, dict]] = []
    data = {"model": "tiny.en", "stream": "true", **fields}
    with httpx.Client(timeout=120) as client:
        t0 = time.perf_counter()
        with client.stream(
            "POST", server.url(path), files={"file": ("a.wav", audio, "audio/wav")}, data=data
        ) as response:
            buffer = ""
            for chunk in response.iter_text():
                buffer += chunk
                while "\n\n" in buffer:
                    raw, buffer = buffer.split("\n\n", 1)
                    lines = raw.split("\n")
                    assert all(line.startswith("data: ") for line in lines), raw
                    payload = "\n".join(line[len("data: ") :] for line in lines)
                    events.append((time.perf_counter() - t0, json.loads(payload)))
            assert buffer.strip() == "", f"trailing bytes after the last event: {buffer!r}"
    return response, events


def test_sse_wire_format_and_order(server: LiveServer) -> None:
    response, events = read_events(server, "/v1/audio/transcriptions", JFK_WAV.read_bytes())
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers.get("cache-control") == "no-cache"
    types = [e["type"] for _, e in events]
    assert types[-1] == "transcript.text.done"
    assert set(types[:-1]) == {"transcript.text.delta"}
    for _, event in events[:-1]:
        assert set(event) == {"type", "delta"} and event["delta"], event
    done = events[-1][1]
    assert set(done) == {"type", "text", "languages"} and done["languages"] == [{"code": "en"}]
    assert normalise(done["text"]) == normalise(JFK_TEXT)
    assert normalise("".join(e["delta"] for _, e in events[:-1])) == normalise(done["text"])


def test_word_deltas_carry_their_times(server: LiveServer) -> None:
    """stream=true with timestamp_granularities[]=word: a delta per word with its start and
    end, the same words and times as verbose_json gives."""
    _, events = read_events(
        server, "/v1/audio/transcriptions", JFK_WAV.read_bytes(),
        **{"timestamp_granularities[]": "word", "language": "en"},
    )  # fmt: skip
    deltas = [e for _, e in events if e["type"] == "transcript.text.delta"]
    assert all(set(d) == {"type", "delta", "start", "end"} for d in deltas), deltas[:3]
    done = events[-1][1]
    assert "".join(d["delta"] for d in deltas).strip() == done["text"]
    assert all(a["end"] <= b["start"] + 1e-6 for a, b in itertools.pairwise(deltas))
    r = httpx.post(
        server.url("/v1/audio/transcriptions"),
        files={"file": ("a.wav", JFK_WAV.read_bytes(), "audio/wav")},
        data={"model": "tiny.en", "response_format": "verbose_json", "language": "en",
              "timestamp_granularities[]": "word", "beam_size": "1"},  # a stream's default
        timeout=120,
    )  # fmt: skip
    words = r.json()["words"]
    assert [(w["word"], w["start"], w["end"]) for w in words] == [
        (d["delta"].strip(), d["start"], d["end"]) for d in deltas
    ]


@functools.cache
def two_minutes() -> bytes:
    """The 60 s clip played twice, as WAV: a decode long enough (~1.5 s at tiny.en) that its
    tokens' spread is measurable however fast a step gets (one play's decode after the first
    token is down to ~0.5 s)."""
    audio, rate = sf.read(str(LONG_WAV), dtype="float32")
    out = io.BytesIO()
    sf.write(out, np.concatenate([audio, audio]), rate, format="WAV", subtype="PCM_16")
    return out.getvalue()


def test_first_delta_leaves_long_before_decoding_ends(server: LiveServer) -> None:
    """On 2 min of speech the first token must arrive well before the last one is decoded.

    Without the VAD pass, which runs over the whole upload before the first window (0.2-0.5 s
    a minute here): this is about the decoder's tokens trickling out; the next test covers the
    default."""
    response, events = read_events(
        server, "/v1/audio/transcriptions", two_minutes(), vad_filter="false"
    )
    assert response.status_code == 200
    deltas = [t for t, e in events if e["type"] == "transcript.text.delta"]
    done_t = events[-1][0]
    assert events[-1][1]["type"] == "transcript.text.done"
    assert len(deltas) > 50
    first, last = deltas[0], deltas[-1]
    print(f"first delta {first:.3f} s, last delta {last:.3f} s, done {done_t:.3f} s")
    # Tokens trickle in over the whole decode instead of arriving in one burst at the end.
    assert first < 0.4 * done_t, (first, done_t)
    assert done_t - first > 0.5, (first, done_t)
    spread = [t for t in deltas if t < (first + done_t) / 2]
    assert len(spread) >= 10, "fewer than 10 deltas in the first half of the decode"


def test_deltas_trickle_with_the_default_vad(server: LiveServer) -> None:
    response, events = read_events(server, "/v1/audio/transcriptions", two_minutes())
    assert response.status_code == 200
    deltas = [t for t, e in events if e["type"] == "transcript.text.delta"]
    done_t = events[-1][0]
    assert len(deltas) > 50
    assert done_t - deltas[0] > 0.5, (deltas[0], done_t)
    assert len([t for t in deltas if t < (deltas[0] + done_t) / 2]) >= 10


def test_translation_stream(server: LiveServer) -> None:
    response, events = read_events(server, "/v1/audio/translations", JFK_WAV.read_bytes())
    assert response.status_code == 200
    assert events[-1][1]["type"] == "transcript.text.done"
    assert normalise(events[-1][1]["text"]) == normalise(JFK_TEXT)


def test_stream_bad_audio_is_a_plain_http_error(server: LiveServer) -> None:
    """Errors found before the first token (undecodable upload) keep their HTTP status."""
    r = httpx.post(
        server.url("/v1/audio/transcriptions"),
        files={"file": ("a.wav", b"definitely not audio" * 50, "audio/wav")},
        data={"model": "tiny.en", "stream": "true"},
        timeout=60,
    )
    assert r.status_code == 415, r.text
    assert r.json()["error"]["param"] == "file"
