"""The events of the OpenAI Realtime transcription protocol (`/v1/realtime?intent=transcription`).

Server events are pydantic models built field for field as the `openai` package's types
(`openai.types.realtime`, and `openai.types.beta.realtime` for the older
`transcription_session.updated`), so `ev.model_dump_json()` is what goes on the wire. Client
events are parsed from the decoded JSON object by `parse_client_event`; what cannot be used raises
`ProtocolError`, whose `.event()` is the `error` event to send back. The audio of
`input_audio_buffer.append` stays base64 here: the caller decodes it.
"""

from __future__ import annotations

import secrets
import string
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.api.schemas import LanguageJSON, LogprobJSON
from app.service.errors import Rejected

_ALPHANUMERIC = string.ascii_letters + string.digits


def _random_id(prefix: str) -> str:
    return prefix + "".join(secrets.choice(_ALPHANUMERIC) for _ in range(22))


def new_event_id() -> str:
    """A server event id: "event_" and 22 random letters and digits."""
    return _random_id("event_")


def new_item_id() -> str:
    """A conversation item id: "item_" and 22 random letters and digits."""
    return _random_id("item_")


def new_session_id() -> str:
    """A session id: "sess_" and 22 random letters and digits."""
    return _random_id("sess_")


# --- server events -------------------------------------------------------------------------


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class _ServerEvent(_Model):
    event_id: str = Field(default_factory=new_event_id)


class SessionCreated(_ServerEvent):
    type: Literal["session.created"] = "session.created"
    session: dict[str, Any]


class SessionUpdated(_ServerEvent):
    type: Literal["session.updated"] = "session.updated"
    session: dict[str, Any]


class TranscriptionSessionUpdated(_ServerEvent):
    """The beta answer to `transcription_session.update`."""

    type: Literal["transcription_session.updated"] = "transcription_session.updated"
    session: dict[str, Any]


class SpeechStarted(_ServerEvent):
    type: Literal["input_audio_buffer.speech_started"] = "input_audio_buffer.speech_started"
    audio_start_ms: int
    item_id: str


class SpeechStopped(_ServerEvent):
    type: Literal["input_audio_buffer.speech_stopped"] = "input_audio_buffer.speech_stopped"
    audio_end_ms: int
    item_id: str


class TimeoutTriggered(_ServerEvent):
    """`turn_detection.idle_timeout_ms` of audio went by without speech: the silent stretch
    (`audio_start_ms` .. `audio_end_ms`) becomes an empty item (`item_id`)."""

    type: Literal["input_audio_buffer.timeout_triggered"] = "input_audio_buffer.timeout_triggered"
    audio_start_ms: int
    audio_end_ms: int
    item_id: str


class Committed(_ServerEvent):
    type: Literal["input_audio_buffer.committed"] = "input_audio_buffer.committed"
    item_id: str
    previous_item_id: str | None = None


class Cleared(_ServerEvent):
    type: Literal["input_audio_buffer.cleared"] = "input_audio_buffer.cleared"


class InputAudioContent(_Model):
    type: Literal["input_audio"] = "input_audio"
    transcript: str | None = None


class UserAudioItem(_Model):
    """The user message a committed audio buffer becomes (its audio is not echoed)."""

    id: str
    object: Literal["realtime.item"] = "realtime.item"
    type: Literal["message"] = "message"
    status: Literal["completed"] = "completed"
    role: Literal["user"] = "user"
    content: list[InputAudioContent] = Field(default_factory=lambda: [InputAudioContent()])


class ItemAdded(_ServerEvent):
    """GA: the committed buffer's item is in the conversation."""

    type: Literal["conversation.item.added"] = "conversation.item.added"
    previous_item_id: str | None = None
    item: UserAudioItem


class ItemCreated(_ServerEvent):
    """Beta: the committed buffer's item is in the conversation."""

    type: Literal["conversation.item.created"] = "conversation.item.created"
    previous_item_id: str | None = None
    item: UserAudioItem


class TranscriptionDelta(_ServerEvent):
    type: Literal["conversation.item.input_audio_transcription.delta"] = (
        "conversation.item.input_audio_transcription.delta"
    )
    item_id: str
    content_index: int = 0
    delta: str


class TranscriptionPartial(_ServerEvent):
    """An extension (only with `?partials=true`): the item's text after its deltas that may
    still change; each replaces the previous one."""

    type: Literal["conversation.item.input_audio_transcription.partial"] = (
        "conversation.item.input_audio_transcription.partial"
    )
    item_id: str
    content_index: int = 0
    text: str


class DurationUsage(_Model):
    type: Literal["duration"] = "duration"
    seconds: float


class TranscriptionCompleted(_ServerEvent):
    type: Literal["conversation.item.input_audio_transcription.completed"] = (
        "conversation.item.input_audio_transcription.completed"
    )
    item_id: str
    content_index: int = 0
    transcript: str
    usage: DurationUsage
    languages: list[LanguageJSON] | None = None  # the language the item was read in
    logprobs: list[LogprobJSON] | None = None  # with include [item...logprobs]


class TranscriptionSegment(_ServerEvent):
    """One speaker's run of an item's words (`gpt-4o-transcribe-diarize`); times in session
    seconds, as `speech_started`'s `audio_start_ms`."""

    type: Literal["conversation.item.input_audio_transcription.segment"] = (
        "conversation.item.input_audio_transcription.segment"
    )
    item_id: str
    content_index: int = 0
    id: str
    speaker: str
    start: float
    end: float
    text: str


class TranscriptionError(_Model):
    type: str = "server_error"
    code: str | None = None
    message: str
    param: str | None = None


class TranscriptionFailed(_ServerEvent):
    type: Literal["conversation.item.input_audio_transcription.failed"] = (
        "conversation.item.input_audio_transcription.failed"
    )
    item_id: str
    content_index: int = 0
    error: TranscriptionError


class ErrorDetail(_Model):
    type: str = "invalid_request_error"
    code: str | None = None
    message: str
    param: str | None = None
    event_id: str | None = None  # the client event that caused it


class ErrorEvent(_ServerEvent):
    type: Literal["error"] = "error"
    error: ErrorDetail


ServerEvent = Annotated[
    SessionCreated
    | SessionUpdated
    | TranscriptionSessionUpdated
    | SpeechStarted
    | SpeechStopped
    | TimeoutTriggered
    | Committed
    | Cleared
    | ItemAdded
    | ItemCreated
    | TranscriptionDelta
    | TranscriptionPartial
    | TranscriptionCompleted
    | TranscriptionFailed
    | ErrorEvent,
    Field(discriminator="type"),
]


# --- client events -------------------------------------------------------------------------


class ProtocolError(Rejected):
    """A client event or session setting that cannot be used, named by the client event's id
    (`event_id`); `.event()` is the answer."""

    def __init__(
        self,
        message: str,
        code: str = "invalid_value",
        param: str | None = None,
        event_id: str | None = None,
    ) -> None:
        super().__init__(code, message, param=param)
        self.event_id = event_id

    def event(self) -> ErrorEvent:
        return ErrorEvent(
            error=ErrorDetail(
                code=self.code, message=self.message, param=self.param, event_id=self.event_id
            )
        )

    def __repr__(self) -> str:
        return f"ProtocolError({self.message!r}, code={self.code!r}, param={self.param!r})"


class _ClientEvent(BaseModel):
    # unknown top-level keys are ignored; the settings inside `session` are checked elsewhere
    model_config = ConfigDict(frozen=True, extra="ignore", strict=True)
    event_id: str | None = None


class SessionUpdate(_ClientEvent):
    """GA `session.update`; `session` is applied by `realtime_config.apply_ga`."""

    type: Literal["session.update"] = "session.update"
    session: dict[str, Any]


class TranscriptionSessionUpdate(_ClientEvent):
    """Beta `transcription_session.update`; `session` is applied by `apply_beta`."""

    type: Literal["transcription_session.update"] = "transcription_session.update"
    session: dict[str, Any]


class AudioAppend(_ClientEvent):
    type: Literal["input_audio_buffer.append"] = "input_audio_buffer.append"
    audio: str  # base64, not decoded here


class AudioCommit(_ClientEvent):
    type: Literal["input_audio_buffer.commit"] = "input_audio_buffer.commit"


class AudioClear(_ClientEvent):
    type: Literal["input_audio_buffer.clear"] = "input_audio_buffer.clear"


ClientEvent = SessionUpdate | TranscriptionSessionUpdate | AudioAppend | AudioCommit | AudioClear

CLIENT_EVENTS: dict[str, type[_ClientEvent]] = {
    "session.update": SessionUpdate,
    "transcription_session.update": TranscriptionSessionUpdate,
    "input_audio_buffer.append": AudioAppend,
    "input_audio_buffer.commit": AudioCommit,
    "input_audio_buffer.clear": AudioClear,
}
_ACCEPTED = ", ".join(CLIENT_EVENTS)
_FIELD_TYPES = {"audio": "a string", "event_id": "a string or null", "session": "an object"}


def parse_client_event(obj: Any) -> ClientEvent:
    """The client event in a decoded JSON message; `ProtocolError` when it cannot be used.

    Errors: `unknown_event` (param "type") for a type we do not accept, `invalid_value` (param
    naming the field) for a missing or ill-typed field. The error carries the event's
    `event_id` when it has a usable one.
    """
    if not isinstance(obj, dict):
        raise ProtocolError(
            f"a client event must be a JSON object, not {json_type(obj)}", param=None
        )
    event_id = obj.get("event_id") if isinstance(obj.get("event_id"), str) else None
    kind = obj.get("type")
    if not isinstance(kind, str):
        what = "is missing" if kind is None else f"must be a string, not {json_type(kind)}"
        raise ProtocolError(
            f"the event's 'type' {what}; accepted types: {_ACCEPTED}",
            param="type",
            event_id=event_id,
        )
    model = CLIENT_EVENTS.get(kind)
    if model is None:
        raise ProtocolError(
            f"unknown or unsupported event type {kind!r} for a transcription session; "
            f"accepted types: {_ACCEPTED}",
            code="unknown_event",
            param="type",
            event_id=event_id,
        )
    try:
        return model.model_validate(obj)  # type: ignore[return-value]
    except ValidationError as e:
        first = e.errors()[0]
        param = ".".join(str(part) for part in first["loc"]) or None
        if first["type"] == "missing":
            message = f"{kind}: the field '{param}' is missing"
        else:
            wanted = _FIELD_TYPES.get(str(param), "valid")
            message = (
                f"{kind}: the field '{param}' must be {wanted}, not {json_type(first.get('input'))}"
            )
        raise ProtocolError(message, param=param, event_id=event_id) from None


def json_type(value: Any) -> str:
    """How a decoded JSON value is named in an error message ("a string", "null", ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
