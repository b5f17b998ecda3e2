"""Property tests (hypothesis) for the WebSocket message parser `parse_client_message`: every
`websocket.receive` message becomes one client event or a `StreamError` (an `error` event, and
a close code only for an oversized frame) — never another exception."""

from __future__ import annotations

import base64
import json
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from app.api.stream import (
    CLOSE_TOO_BIG,
    AudioAppend,
    BufferCommit,
    SessionClose,
    SessionUpdate,
    StreamError,
    parse_client_message,
)

MAX_BYTES = 8192
KNOWN_TYPES = [
    "session.update",
    "input_audio_buffer.append",
    "input_audio_buffer.commit",
    "session.close",
]
FUZZ = settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "300")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)  # what json.dumps writes as JSON
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
EVENTS = st.fixed_dictionaries(
    {"type": st.sampled_from(KNOWN_TYPES) | st.text(max_size=20) | JSON_VALUES},
    optional={
        "audio": st.binary(max_size=64).map(lambda b: base64.b64encode(b).decode())
        | st.text(max_size=40)
        | JSON_VALUES,
        "session": JSON_VALUES,
        "event_id": st.text(max_size=8),
    },
)


def parse_or_error(message: dict[str, Any]) -> AudioAppend | SessionUpdate | BufferCommit | \
        SessionClose | StreamError:  # fmt: skip
    try:
        return parse_client_message(message, MAX_BYTES)
    except StreamError as e:
        event = e.event()
        assert event["type"] == "error" and event["error"]["message"] and event["error"]["code"]
        assert e.close in (None, CLOSE_TOO_BIG)
        return e


def text(payload: str) -> dict[str, Any]:
    return {"type": "websocket.receive", "text": payload}


@FUZZ
@given(st.binary(max_size=2 * MAX_BYTES))
def test_binary_frames(data: bytes) -> None:
    result = parse_or_error({"type": "websocket.receive", "bytes": data})
    if len(data) > MAX_BYTES:
        assert isinstance(result, StreamError) and result.close == CLOSE_TOO_BIG
        assert result.code == "message_too_large"
    else:
        assert result == AudioAppend(data)


@FUZZ
@given(st.text(max_size=200))
@example("[" * 3000)  # nesting deeper than the JSON parser's recursion limit
@example("9" * 5000)  # an integer longer than Python's int-from-string limit
@example('{"type": "session.update", "session": {"vad": {"threshold": NaN}}}')
@example('{"type": "session.close", "x": Infinity}')
@example("")
def test_any_text(payload: str) -> None:
    result = parse_or_error(text(payload))
    if isinstance(result, StreamError):
        assert result.close is None
        assert result.code in {"invalid_json", "invalid_event", "unknown_event", "invalid_audio"}


@FUZZ
@given(EVENTS)
def test_json_events(event: dict[str, Any]) -> None:
    result = parse_or_error(text(json.dumps(event)))
    kind = event["type"]
    if not isinstance(kind, str):
        assert isinstance(result, StreamError) and result.code == "invalid_event"
    elif kind == "session.update":
        assert result == SessionUpdate(event.get("session"))
    elif kind == "input_audio_buffer.commit":
        assert result == BufferCommit()
    elif kind == "session.close":
        assert result == SessionClose()
    elif kind == "input_audio_buffer.append":
        audio = event.get("audio")
        try:
            expected = base64.b64decode(audio, validate=True) if isinstance(audio, str) else None
        except ValueError:
            expected = None
        if expected is None:
            assert isinstance(result, StreamError) and result.code == "invalid_audio"
        else:
            assert result == AudioAppend(expected)
    else:
        assert isinstance(result, StreamError) and result.code == "unknown_event"
        assert result.param == "type"


@FUZZ
@given(JSON_VALUES.filter(lambda v: not isinstance(v, dict)))
def test_json_that_is_not_an_object(value: Any) -> None:
    result = parse_or_error(text(json.dumps(value)))
    assert isinstance(result, StreamError) and result.code == "invalid_event"


def test_oversized_text_closes_with_1009() -> None:
    message = json.dumps({"type": "input_audio_buffer.append", "audio": "A" * MAX_BYTES})
    with pytest.raises(StreamError) as info:
        parse_client_message(text(message), MAX_BYTES)
    assert info.value.close == CLOSE_TOO_BIG and info.value.code == "message_too_large"


def test_message_without_payload() -> None:
    with pytest.raises(StreamError) as info:
        parse_client_message({"type": "websocket.receive"}, MAX_BYTES)
    assert info.value.code == "invalid_message" and info.value.close is None


def test_non_ascii_base64_is_invalid_audio() -> None:
    event = json.dumps({"type": "input_audio_buffer.append", "audio": "AAAA\u00e9"})
    with pytest.raises(StreamError) as info:
        parse_client_message(text(event), MAX_BYTES)
    assert info.value.code == "invalid_audio" and info.value.param == "audio"
