"""`GET /v1/audio/stream`: live transcription over a WebSocket, this server's own protocol.

Client -> server:

- `session.update` (`audio_stream_config`), before the first audio;
- binary frames of raw mono PCM in the session's encoding and rate, or
  `{"type":"input_audio_buffer.append","audio":"<base64>"}`;
- `{"type":"input_audio_buffer.commit"}`: finalize everything sent so far;
- `{"type":"session.close"}`: finalize, send `transcript.text.done`, close (1000).

Server -> client: `session.created` / `session.updated` {session}, `transcript.text.partial`
{text} (the unstable tail; replaces the previous partial), `transcript.text.delta`
{delta, start, end} (committed, append-only; seconds of stream time), `transcript.segment`
{segment}, `transcript.text.done` {text}, `error` {error} (OpenAI's error object). With
`"speakers": true` (and STT_DIARIZATION on): after each `transcript.segment`, `transcript.speakers`
{segment_id, speakers: [{speaker, start, end, text}]}, its runs of one speaker, labelled `A`, `B`,
... for the whole session or named by an enrolled voice (`speakers.py`).

Bad messages (invalid JSON, unknown type, audio that is not whole samples, base64 that does not
decode, options that do not apply) get an `error` event and the session goes on; limits and
admission as every live protocol (`connection.py`). New clients: `/v1/realtime` speaks the
OpenAI Realtime protocol over the same sessions.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any, Literal

from fastapi import APIRouter, WebSocket
from pydantic import BaseModel

from app.api.deps import ServicesDep
from app.api.errors import error_type
from app.api.live.audio_stream_config import StreamConfig, apply_update
from app.api.live.connection import (
    LiveConnection,
    LiveDeps,
    check_size,
    load_json_event,
    serve,
)
from app.api.live.speakers import SpeakerSender, diarization_refusal, speaker_sender
from app.api.live.stream_options import audio_stream_options
from app.api.schemas import ErrorEvent, ErrorObject, LanguageJSON, TextDeltaEvent, TextDoneEvent
from app.service.diarize.attribution import SpeakerSegment
from app.service.errors import Rejected
from app.service.live import (
    AudioDecodeError,
    CommittedText,
    PartialText,
    PcmInput,
    StreamEvent,
    StreamSegment,
)

router = APIRouter(tags=["streaming"])
SPEAKERS_PARAM = "session.speakers"


# ---- wire events (server -> client) -------------------------------------------------------
class SessionEvent(BaseModel):
    type: Literal["session.created", "session.updated"]
    session: dict[str, Any]


class PartialEvent(BaseModel):
    type: Literal["transcript.text.partial"] = "transcript.text.partial"
    text: str


class SegmentJSON(BaseModel):
    id: int
    start: float
    end: float
    text: str


class SegmentEvent(BaseModel):
    type: Literal["transcript.segment"] = "transcript.segment"
    segment: SegmentJSON


class SpeakerRunJSON(BaseModel):
    speaker: str
    start: float
    end: float
    text: str


class SpeakersEvent(BaseModel):
    type: Literal["transcript.speakers"] = "transcript.speakers"
    segment_id: int
    speakers: list[SpeakerRunJSON]


def speakers_events(segment_id: str, runs: list[SpeakerSegment]) -> list[BaseModel]:
    """A segment's runs of one speaker as its `transcript.speakers` event."""
    speakers = [SpeakerRunJSON(speaker=r.speaker, start=r.start, end=r.end, text=r.text)
                for r in runs]  # fmt: skip
    return [SpeakersEvent(segment_id=int(segment_id), speakers=speakers)] if runs else []


def error_event(error: Rejected) -> ErrorEvent:
    return ErrorEvent(error=ErrorObject(message=error.message, type=error_type(error),
                                        param=error.param, code=error.code))  # fmt: skip


# ---- client messages ------------------------------------------------------------------------
@dataclass(frozen=True)
class AudioAppend:
    """Raw audio bytes (a binary frame, or the decoded base64 of `input_audio_buffer.append`)."""

    data: bytes


@dataclass(frozen=True)
class SessionUpdate:
    """`session.update`; `patch` is the client's `session` value, not checked yet."""

    patch: Any


@dataclass(frozen=True)
class BufferCommit:
    """`input_audio_buffer.commit`."""


@dataclass(frozen=True)
class SessionClose:
    """`session.close`."""


ClientMessage = AudioAppend | SessionUpdate | BufferCommit | SessionClose


def decode_base64_audio(audio: Any) -> bytes:
    if not isinstance(audio, str):
        raise Rejected("invalid_audio", "'audio' must be a base64 string", param="audio")
    try:
        return base64.b64decode(audio, validate=True)
    except (binascii.Error, ValueError) as e:
        raise Rejected("invalid_audio", f"'audio' is not valid base64: {e}",
                       param="audio") from e  # fmt: skip


def parse_client_message(message: dict[str, Any], max_bytes: int) -> ClientMessage:
    """One ASGI `websocket.receive` message -> the client event it carries.

    `max_bytes`: largest accepted frame (bytes of a binary frame, characters of a text frame).
    Raises `Rejected`: "message_too_large" (it ends the session) for a frame over `max_bytes`,
    otherwise (report and go on) for an empty message, text that is not a JSON object with a
    string `type`, an unknown type, or `audio` that is not base64. Whether the audio bytes are
    whole samples is checked later, per session encoding.
    """
    data = message.get("bytes")
    if data is not None:
        check_size(len(data), max_bytes)
        return AudioAppend(bytes(data))
    text = message.get("text")
    if text is None:
        raise Rejected("invalid_message", "empty message")
    check_size(len(text), max_bytes)
    event = load_json_event(text)
    kind = event["type"]
    if kind == "session.update":
        return SessionUpdate(event.get("session"))
    if kind == "input_audio_buffer.append":
        return AudioAppend(decode_base64_audio(event.get("audio")))
    if kind == "input_audio_buffer.commit":
        return BufferCommit()
    if kind == "session.close":
        return SessionClose()
    raise Rejected(
        "unknown_event", f"unknown event type {kind!r}; expected session.update, "
        "input_audio_buffer.append, input_audio_buffer.commit or session.close", param="type",
    )  # fmt: skip


# ---- the adapter ----------------------------------------------------------------------------
class AudioStreamConnection(LiveConnection):
    def __init__(self, websocket: WebSocket, deps: LiveDeps) -> None:
        super().__init__(websocket, deps)
        self.config = StreamConfig.default(deps.models.get(None), deps.defaults)
        self.speakers: SpeakerSender | None = None  # with config.speakers

    def session_json(self) -> dict[str, Any]:
        return self.config.as_json(self.settings.stream_step_s)

    def describe(self) -> str:
        return str(self.session_json())

    def greeting(self) -> BaseModel:
        return SessionEvent(type="session.created", session=self.session_json())

    def error_event(self, error: Rejected) -> BaseModel:
        return error_event(error)

    def on_event(self, event: StreamEvent) -> None:
        match event:
            case PartialText(text=text):
                self.outbox.put(PartialEvent(text=text), replaceable=True)
            case CommittedText(text=text, start=start, end=end):
                self.outbox.put(TextDeltaEvent(delta=text, start=start, end=end))
            case StreamSegment(id=id_, start=start, end=end, text=text, words=words):
                segment = SegmentJSON(id=id_, start=start, end=end, text=text)
                self.outbox.put(SegmentEvent(segment=segment))
                if self.speakers is not None:
                    self.speakers.item(str(id_), start, end, words)

    async def handle(self, message: dict[str, Any]) -> bool:
        match parse_client_message(message, self.max_frame):
            case AudioAppend(data=data):
                self._append(data)
            case SessionUpdate(patch=patch):
                if self.runner is not None:
                    raise Rejected("session_started",
                                   "session.update must come before the first audio",
                                   param="session")  # fmt: skip
                config = apply_update(self.config, patch, self.deps.models)
                refusal = diarization_refusal(self.settings, self.deps.diarizer, SPEAKERS_PARAM)
                if config.speakers and refusal is not None:
                    raise refusal
                self.config = config
                self.outbox.put(SessionEvent(type="session.updated", session=self.session_json()))
            case BufferCommit():
                if self.runner is not None:
                    self.runner.commit()
            case SessionClose():
                return True
        return False

    def _append(self, data: bytes) -> None:
        if self.runner is None:
            config = self.config
            pcm = PcmInput(config.encoding, config.sample_rate)
            options = audio_stream_options(config, self.deps.defaults)
            self.start_runner(config.model, options, pcm)
            if config.speakers:
                put = self.outbox.put
                self.speakers = speaker_sender(self.deps, speakers_events, put, self.say)
        assert self.runner is not None
        try:
            samples = self.runner.convert(data)
        except AudioDecodeError as e:
            raise Rejected("invalid_audio", f"audio frame dropped: {e}") from e
        self.runner.feed(samples)
        if self.speakers is not None:
            self.speakers.hear(samples)

    async def finish(self) -> None:
        text = await self.close_runner()
        if self.speakers is not None:
            await self.speakers.drain()  # the last segments' speakers before the text's end
        language = self.runner.language if self.runner is not None else None
        self.outbox.put(TextDoneEvent(text=text, languages=LanguageJSON.listed(language)))


@router.websocket("/v1/audio/stream")
async def audio_stream(websocket: WebSocket, services: ServicesDep) -> None:
    """Live transcription; see the module docstring for the protocol."""
    await serve(websocket, services, error_event, AudioStreamConnection)
