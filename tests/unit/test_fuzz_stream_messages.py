"""Property tests (hypothesis) for the `/v1/audio/stream` message parser `parse_client_message`:
every `websocket.receive` message becomes one client event or a `Rejected` (an `error` event,
and a close code only for an oversized frame) — never another exception. Likewise for the
`session.update` values a client sends (`apply_update`, with a stand-in registry)."""

from __future__ import annotations

import base64
import json
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from app.api.live.audio_stream import (
    AudioAppend,
    BufferCommit,
    SessionClose,
    SessionUpdate,
    error_event,
    parse_client_message,
)
from app.api.live.audio_stream_config import StreamConfig, apply_update
from app.api.live.connection import CLOSE_TOO_BIG, close_code
from app.api.live.stream_options import audio_stream_options, live_defaults
from app.config import Settings
from app.service.errors import Rejected
from app.service.live import ENCODINGS, StreamingOptions
from app.service.transcription.jobs import UnknownModelError
from app.service.transcription.transcriber import TranscriptionOptions

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
        SessionClose | Rejected:  # fmt: skip
    try:
        return parse_client_message(message, MAX_BYTES)
    except Rejected as e:
        event = error_event(e)
        assert event.type == "error" and event.error.message and event.error.code
        assert close_code(e) in (None, CLOSE_TOO_BIG)
        return e


def text(payload: str) -> dict[str, Any]:
    return {"type": "websocket.receive", "text": payload}


@FUZZ
@given(st.binary(max_size=2 * MAX_BYTES))
def test_binary_frames(data: bytes) -> None:
    result = parse_or_error({"type": "websocket.receive", "bytes": data})
    if len(data) > MAX_BYTES:
        assert isinstance(result, Rejected) and close_code(result) == CLOSE_TOO_BIG
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
    if isinstance(result, Rejected):
        assert close_code(result) is None
        assert result.code in {"invalid_json", "invalid_event", "unknown_event", "invalid_audio"}


@FUZZ
@given(EVENTS)
def test_json_events(event: dict[str, Any]) -> None:
    result = parse_or_error(text(json.dumps(event)))
    kind = event["type"]
    if not isinstance(kind, str):
        assert isinstance(result, Rejected) and result.code == "invalid_event"
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
            assert isinstance(result, Rejected) and result.code == "invalid_audio"
        else:
            assert result == AudioAppend(expected)
    else:
        assert isinstance(result, Rejected) and result.code == "unknown_event"
        assert result.param == "type"


@FUZZ
@given(JSON_VALUES.filter(lambda v: not isinstance(v, dict)))
def test_json_that_is_not_an_object(value: Any) -> None:
    result = parse_or_error(text(json.dumps(value)))
    assert isinstance(result, Rejected) and result.code == "invalid_event"


def test_oversized_text_closes_with_1009() -> None:
    message = json.dumps({"type": "input_audio_buffer.append", "audio": "A" * MAX_BYTES})
    with pytest.raises(Rejected) as info:
        parse_client_message(text(message), MAX_BYTES)
    assert close_code(info.value) == CLOSE_TOO_BIG and info.value.code == "message_too_large"


def test_message_without_payload() -> None:
    with pytest.raises(Rejected) as info:
        parse_client_message({"type": "websocket.receive"}, MAX_BYTES)
    assert info.value.code == "invalid_message" and close_code(info.value) is None


def test_non_ascii_base64_is_invalid_audio() -> None:
    event = json.dumps({"type": "input_audio_buffer.append", "audio": "AAAA\u00e9"})
    with pytest.raises(Rejected) as info:
        parse_client_message(text(event), MAX_BYTES)
    assert info.value.code == "invalid_audio" and info.value.param == "audio"


# ---- session.update -----------------------------------------------------------------------------
class _EnglishModel:
    name = "tiny.en"
    multilingual = False


class _OneModelRegistry:
    """What `apply_update` asks of the registry while it configures a session (no model)."""

    base_options = TranscriptionOptions()
    vad = object()

    def get(self, name: str | None) -> _EnglishModel:
        if name not in (None, "tiny.en"):
            raise UnknownModelError(name, ["tiny.en"])
        return _EnglishModel()


SESSION_VALUES = {
    "model": st.sampled_from([None, "tiny.en", "base", "../tiny.en"]) | JSON_VALUES,
    "language": st.sampled_from([None, "", "en", "EN", "english", "de", "xx"]) | JSON_VALUES,
    "task": st.sampled_from(["transcribe", "translate", "dance"]) | JSON_VALUES,
    "sample_rate": st.sampled_from([8000, 16000, 48000, 192000, 7999, 192001, 16000.0, True])
    | JSON_VALUES,
    "encoding": st.sampled_from(["pcm_s16le", "pcm_f32le", "mp3"]) | JSON_VALUES,
    "prompt": st.text(max_size=30) | JSON_VALUES,
    "vad": st.booleans()
    | st.none()
    | st.dictionaries(
        st.sampled_from(["threshold", "silence_duration_ms", "prefix_padding_ms", "type", "x"]),
        st.floats(allow_nan=False) | st.integers(-(10**6), 10**6) | st.booleans() | JSON_VALUES,
        max_size=4,
    )
    | JSON_VALUES,
}
SESSION_PATCHES = st.fixed_dictionaries({}, optional=SESSION_VALUES) | JSON_VALUES


@FUZZ
@given(st.lists(SESSION_PATCHES, min_size=1, max_size=4))
def test_session_updates(patches: list[Any]) -> None:
    """Each update is applied whole (a config the session can run with) or refused whole with
    an error event that keeps the connection open."""

    registry = _OneModelRegistry()
    settings = Settings(models=["tiny.en"])
    config = StreamConfig(_EnglishModel(), "en")  # type: ignore[arg-type]
    for patch in patches:
        try:
            updated = apply_update(config, patch, registry)  # type: ignore[arg-type]
        except Rejected as e:  # reported; the session goes on
            assert e.kind in ("invalid_request", "not_found") and e.message
            continue
        assert isinstance(updated.sample_rate, int) and 8000 <= updated.sample_rate <= 192000
        assert updated.encoding in ENCODINGS
        assert updated.task == "transcribe" and updated.language == "en"  # English-only
        assert updated.prompt is None or isinstance(updated.prompt, str)
        defaults = live_defaults(
            settings, registry.base_options, vad_installed=True, turn_installed=True
        )
        options = audio_stream_options(updated, defaults)
        assert isinstance(options, StreamingOptions) and options.language == "en"
        config = updated
