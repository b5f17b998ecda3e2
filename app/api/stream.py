"""`GET /v1/audio/stream`: live transcription over a WebSocket, and the browser page at `/`.

Protocol (see docs and DESIGN.md). Client -> server:

- `{"type":"session.update","session":{"model","language","task","sample_rate","encoding",
  "prompt","vad","word_timestamps"}}` before the first audio (defaults: the default model,
  language detected or English, 16000 Hz, `pcm_s16le`, VAD as STT_VAD_FILTER: on, word times
  estimated). `vad` is `true`/`false` or `{"threshold", "silence_duration_ms",
  "prefix_padding_ms"}`; `word_timestamps: true` measures the deltas' `start`/`end`.
- binary frames of raw mono PCM in the session's encoding and rate, or
  `{"type":"input_audio_buffer.append","audio":"<base64>"}`;
- `{"type":"input_audio_buffer.commit"}`: finalize everything sent so far;
- `{"type":"session.close"}`: finalize, send `transcript.text.done`, close (1000).

Server -> client: `session.created` / `session.updated` {session}, `transcript.text.partial`
{text} (the unstable tail; replaces the previous partial), `transcript.text.delta`
{delta, start, end} (committed, append-only; seconds of stream time), `transcript.segment`
{segment}, `transcript.text.done` {text}, `error` {error} (OpenAI's error object).

Authentication (when `STT_API_KEY` is set): `Authorization: Bearer <key>`, or, for browsers that
cannot set headers on a WebSocket, the query parameter `?api_key=<key>` or the subprotocol
`openai-insecure-api-key.<key>`. A wrong key gets an `error` event and close code 1008.

Bad messages (invalid JSON, unknown type, audio that is not whole samples, base64 that does not
decode, options that do not apply) get an `error` event and the session goes on. Limits close
the connection after an `error` event: message larger than `STT_STREAM_MAX_FRAME_KB` (1009),
session longer than `STT_STREAM_MAX_SESSION_S` of audio, more than `STT_STREAM_MAX_BUFFERED_S`
of audio waiting to be transcribed, or no message for `STT_STREAM_IDLE_TIMEOUT_S` (1008); too
many sessions or models not loaded (1013); an internal failure (1011).

Decoding runs on the shared worker pool (VAD and buffering on a helper thread), never on the
event loop; each connection has its own sender task, so a client that reads slowly holds up only
itself (its pending partials are merged: only the newest is kept).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import logging
import threading
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from fastapi.responses import FileResponse, Response
from starlette.websockets import WebSocketState

from app.api.auth import WS_KEY_SUBPROTOCOL_PREFIX, key_matches, websocket_key
from app.api.deps import Readiness
from app.config import Settings
from app.service.pool import PoolClosedError, QueueFullError, WorkerPool
from app.service.registry import (
    InvalidRequestError,
    LoadedModel,
    ModelRegistry,
    UnknownModelError,
    language_code,
)
from app.service.streaming import (
    ENCODINGS,
    AudioDecodeError,
    CommittedText,
    PartialText,
    PcmInput,
    SileroVad,
    StreamEvent,
    StreamingOptions,
    StreamingSession,
    StreamSegment,
    TranscriptionCancelled,
    VadOptions,
)

log = logging.getLogger(__name__)

router = APIRouter(tags=["streaming"])

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
STATIC_FILES = {
    "app.js": "text/javascript",
    "worklet.js": "text/javascript",
    "style.css": "text/css",
}
CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_POLICY = 1008
CLOSE_TOO_BIG = 1009
CLOSE_INTERNAL = 1011
CLOSE_TRY_AGAIN = 1013
FINISH_TIMEOUT_S = 120.0  # most time a close/commit may take to drain
QUEUE_RETRY_S = 0.25  # wait before retrying a pass the pool had no room for


# ---- page -----------------------------------------------------------------------------------
@router.get("/", include_in_schema=False)
async def index() -> Response:
    return FileResponse(STATIC_DIR / "index.html", media_type="text/html")


@router.get("/static/{name}", include_in_schema=False)
async def static_file(name: str) -> Response:
    media_type = STATIC_FILES.get(name)  # a fixed list: no path from the request touches disk
    if media_type is None or not (STATIC_DIR / name).is_file():
        return Response(status_code=404)
    return FileResponse(STATIC_DIR / name, media_type=media_type)


# ---- helpers ----------------------------------------------------------------------------------
class StreamError(Exception):
    """A problem to report as an `error` event; `close` is the close code, None to go on."""

    def __init__(
        self,
        message: str,
        code: str,
        *,
        param: str | None = None,
        close: int | None = None,
        type_: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.code = code
        self.param = param
        self.close = close
        self.type = type_

    def event(self) -> dict[str, Any]:
        return error_event(str(self), self.code, self.param, self.type)


def error_event(
    message: str, code: str, param: str | None = None, type_: str = "invalid_request_error"
) -> dict[str, Any]:
    return {
        "type": "error",
        "error": {"message": message, "type": type_, "param": param, "code": code},
    }


def event_json(event: StreamEvent) -> dict[str, Any]:
    match event:
        case PartialText(text=text):
            return {"type": "transcript.text.partial", "text": text}
        case CommittedText(text=text, start=start, end=end):
            return {"type": "transcript.text.delta", "delta": text, "start": start, "end": end}
        case StreamSegment(id=id_, start=start, end=end, text=text):
            return {
                "type": "transcript.segment",
                "segment": {"id": id_, "start": start, "end": end, "text": text},
            }
    raise TypeError(f"unknown stream event {event!r}")


class _Outbox:
    """Events waiting to be sent. A new partial replaces a partial that is still waiting."""

    def __init__(self) -> None:
        self._items: deque[dict[str, Any]] = deque()
        self._ready = asyncio.Event()

    def put(self, item: dict[str, Any]) -> None:
        is_partial = item.get("type") == "transcript.text.partial"
        if is_partial and self._items and self._items[-1].get("type") == item["type"]:
            self._items[-1] = item
        else:
            self._items.append(item)
        self._ready.set()

    async def get(self) -> dict[str, Any]:
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        return self._items.popleft()

    def empty(self) -> bool:
        return not self._items


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


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_client_message(message: dict[str, Any], max_bytes: int) -> ClientMessage:
    """One ASGI `websocket.receive` message -> the client event it carries.

    `max_bytes`: largest accepted frame (bytes of a binary frame, characters of a text frame).
    Raises `StreamError`: with `close=CLOSE_TOO_BIG` for a frame over `max_bytes`, otherwise
    (`close=None`: report and go on) for an empty message, text that is not a JSON object with a
    string `type` (NaN/Infinity and absurd nesting included), an unknown type, or `audio` that is
    not base64. Whether the audio bytes are whole samples is checked later, per session encoding.
    """
    data = message.get("bytes")
    if data is not None:
        _check_size(len(data), max_bytes)
        return AudioAppend(bytes(data))
    text = message.get("text")
    if text is None:
        raise StreamError("empty message", "invalid_message")
    _check_size(len(text), max_bytes)
    try:
        event = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        raise StreamError(
            f"text messages must be JSON events ({e.msg} at {e.pos}); send audio as binary "
            "frames or input_audio_buffer.append", "invalid_json",
        ) from e  # fmt: skip
    except (ValueError, RecursionError) as e:  # NaN, 5000-digit numbers, [[[[... nesting
        raise StreamError(f"text messages must be JSON events ({e})", "invalid_json") from e
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        raise StreamError("an event is a JSON object with a string 'type'", "invalid_event")
    kind = event["type"]
    if kind == "session.update":
        return SessionUpdate(event.get("session"))
    if kind == "input_audio_buffer.append":
        audio = event.get("audio")
        if not isinstance(audio, str):
            raise StreamError("'audio' must be a base64 string", "invalid_audio", param="audio")
        try:
            return AudioAppend(base64.b64decode(audio, validate=True))
        except (binascii.Error, ValueError) as e:
            raise StreamError(f"'audio' is not valid base64: {e}", "invalid_audio",
                              param="audio") from e  # fmt: skip
    if kind == "input_audio_buffer.commit":
        return BufferCommit()
    if kind == "session.close":
        return SessionClose()
    raise StreamError(
        f"unknown event type {kind!r}; expected session.update, input_audio_buffer.append,"
        " input_audio_buffer.commit or session.close", "unknown_event", param="type",
    )  # fmt: skip


def _check_size(size: int, max_bytes: int) -> None:
    if size > max_bytes:
        raise StreamError(
            f"message of {size} bytes is larger than the limit of {max_bytes}",
            "message_too_large", close=CLOSE_TOO_BIG,
        )  # fmt: skip


# ---- the endpoint -----------------------------------------------------------------------------
@router.websocket("/v1/audio/stream")
async def audio_stream(websocket: WebSocket) -> None:
    """Live transcription; see the module docstring for the protocol."""
    app = websocket.app
    settings: Settings = app.state.settings
    offered = [
        p.strip()
        for p in websocket.headers.get("sec-websocket-protocol", "").split(",")
        if p.strip()
    ]
    plain = [p for p in offered if not p.startswith(WS_KEY_SUBPROTOCOL_PREFIX)]
    await websocket.accept(subprotocol=(plain or offered or [None])[0])

    presented = websocket_key(websocket) or websocket.query_params.get("api_key")
    if not key_matches(settings.api_key, presented):
        message = "Incorrect API key provided." if presented else "You didn't provide an API key."
        await _refuse(websocket, error_event(message, "invalid_api_key"), CLOSE_POLICY)
        return
    readiness: Readiness = app.state.readiness
    if not readiness.ready:
        detail = readiness.error or "the models are still loading; retry shortly"
        await _refuse(
            websocket, error_event(detail, "loading", type_="server_error"), CLOSE_TRY_AGAIN
        )
        return
    drain: asyncio.Event = app.state.stream_drain
    if drain.is_set():
        await _refuse(
            websocket,
            error_event("the server is shutting down; reconnect", "shutting_down",
                        type_="server_error"),
            CLOSE_TRY_AGAIN,
        )  # fmt: skip
        return
    open_sessions: int = getattr(app.state, "stream_sessions", 0)
    if open_sessions >= settings.stream_max_sessions:
        message = f"too many live sessions ({settings.stream_max_sessions}); retry later"
        await _refuse(
            websocket, error_event(message, "too_many_sessions", type_="server_error"),
            CLOSE_TRY_AGAIN,
        )  # fmt: skip
        return
    app.state.stream_sessions = open_sessions + 1
    metrics = getattr(app.state, "metrics", None)
    if metrics is not None:
        metrics.active_streams.inc()
    try:
        registry: ModelRegistry = app.state.registry
        vad = registry.vad  # the Silero model the registry loaded beside the Whisper models
        connection = _Connection(websocket, settings, registry, app.state.pool, vad, drain)
        await connection.run()
    finally:
        app.state.stream_sessions -= 1
        if metrics is not None:
            metrics.active_streams.dec()


async def _refuse(websocket: WebSocket, event: dict[str, Any], code: int) -> None:
    with contextlib.suppress(Exception):
        await websocket.send_json(event)
        await websocket.close(code=code, reason=event["error"]["code"])


class _Connection:
    """One WebSocket session: receive loop, processing task, sender task."""

    def __init__(
        self,
        websocket: WebSocket,
        settings: Settings,
        registry: ModelRegistry,
        pool: WorkerPool,
        vad: SileroVad | None,
        drain: asyncio.Event,
    ) -> None:
        """drain: set at shutdown; the session then ends as if the client had closed it."""
        self.ws = websocket
        self.drain = drain
        self.settings = settings
        self.registry = registry
        self.pool = pool
        self.vad_model = vad
        self.loop = asyncio.get_running_loop()
        self.outbox = _Outbox()
        self.cancel = threading.Event()
        self.wake = asyncio.Event()
        self.finished = asyncio.Event()
        self.closing = False
        self.failure: StreamError | None = None
        self.max_frame = settings.stream_max_frame_kb * 1024
        # session configuration (changeable until the first audio)
        self.model: LoadedModel = registry.get(None)
        self.config: dict[str, Any] = {
            "model": self.model.name,
            "language": None if self.model.multilingual else "en",
            "task": "transcribe",
            "sample_rate": 16000,
            "encoding": "pcm_s16le",
            "prompt": None,
            "vad": vad is not None and settings.vad_filter,
            "word_timestamps": False,
        }
        self.vad_options = VadOptions()
        self.preroll_s = StreamingOptions().preroll_s
        self.options = self._stream_options()
        self.session: StreamingSession | None = None
        self.pcm: PcmInput | None = None

    # ---- configuration --------------------------------------------------------------------
    def _stream_options(self) -> StreamingOptions:
        return StreamingOptions(
            language=self.config["language"],
            task=self.config["task"],
            step_s=self.settings.stream_step_s,
            vad=self.vad_options if self.config["vad"] else None,
            preroll_s=self.preroll_s,
            prompt=self.config["prompt"],
            no_speech_threshold=self.registry.base_options.no_speech_threshold,
            kv_cache=self.registry.base_options.kv_cache,
            word_timestamps=self.config["word_timestamps"],
        )

    def _update(self, patch: Any) -> None:
        """Apply a `session.update`; raises StreamError and leaves the config unchanged."""
        if self.session is not None:
            raise StreamError(
                "session.update must come before the first audio", "session_started",
                param="session",
            )  # fmt: skip
        if not isinstance(patch, dict):
            raise StreamError("'session' must be an object", "invalid_value", param="session")
        unknown = set(patch) - {*self.config, "type", "object", "id"}
        if unknown:
            raise StreamError(
                f"unknown session field(s): {', '.join(sorted(unknown))}", "unknown_parameter",
                param=f"session.{sorted(unknown)[0]}",
            )  # fmt: skip
        config = dict(self.config)
        model = self.model
        vad_options, preroll_s = self.vad_options, self.preroll_s
        if patch.get("model") is not None:
            try:
                model = self.registry.get(str(patch["model"]))
            except UnknownModelError as e:
                raise StreamError(str(e), "model_not_found", param="session.model") from e
            config["model"] = model.name
            if config["language"] == "en" and "language" not in patch and model.multilingual:
                config["language"] = None
        if "language" in patch:
            try:
                config["language"] = language_code(patch["language"])
            except (InvalidRequestError, AttributeError) as e:
                raise StreamError(
                    f"unsupported language {patch['language']!r}", "unsupported_language",
                    param="session.language",
                ) from e  # fmt: skip
        if not model.multilingual:
            if config["language"] not in (None, "en"):
                raise StreamError(
                    f"the model '{model.name}' is English-only", "unsupported_language",
                    param="session.language",
                )  # fmt: skip
            config["language"] = "en"
        if "task" in patch:
            if patch["task"] not in ("transcribe", "translate"):
                raise StreamError(
                    "task must be 'transcribe' or 'translate'", "invalid_value",
                    param="session.task",
                )  # fmt: skip
            config["task"] = patch["task"] if model.multilingual else "transcribe"
        if "sample_rate" in patch:
            rate = patch["sample_rate"]
            if not isinstance(rate, int) or isinstance(rate, bool) or not 8000 <= rate <= 192000:
                raise StreamError(
                    "sample_rate must be an integer from 8000 to 192000 (Hz)", "invalid_value",
                    param="session.sample_rate",
                )  # fmt: skip
            config["sample_rate"] = rate
        if "encoding" in patch:
            if patch["encoding"] not in ENCODINGS:
                raise StreamError(
                    f"encoding must be one of {', '.join(ENCODINGS)}", "invalid_value",
                    param="session.encoding",
                )  # fmt: skip
            config["encoding"] = patch["encoding"]
        if "prompt" in patch:
            prompt = patch["prompt"]
            if prompt is not None and not isinstance(prompt, str):
                raise StreamError(
                    "prompt must be a string", "invalid_value", param="session.prompt"
                )
            config["prompt"] = prompt or None
        if "word_timestamps" in patch:
            if not isinstance(patch["word_timestamps"], bool):
                raise StreamError(
                    "word_timestamps must be true or false", "invalid_value",
                    param="session.word_timestamps",
                )  # fmt: skip
            config["word_timestamps"] = patch["word_timestamps"]
        if "vad" in patch:
            config["vad"], vad_options, preroll_s = self._vad_setting(
                patch["vad"], vad_options, preroll_s
            )
        self.config, self.model = config, model
        self.vad_options, self.preroll_s = vad_options, preroll_s
        self.options = self._stream_options()

    def _vad_setting(
        self, value: Any, current: VadOptions, preroll_s: float
    ) -> tuple[bool, VadOptions, float]:
        """`vad` of session.update -> (on, options, seconds of audio kept before speech)."""
        if value is None or value is False:
            return False, current, preroll_s
        if self.vad_model is None:
            raise StreamError(
                "VAD is not available on this server (models/silero_vad.onnx is missing)",
                "vad_unavailable", param="session.vad",
            )  # fmt: skip
        if value is True:
            return True, current, preroll_s
        if not isinstance(value, dict):
            raise StreamError("vad must be true, false or an object", "invalid_value",
                              param="session.vad")  # fmt: skip
        changes: dict[str, float] = {}
        fields = {
            "threshold": ("threshold", 1.0),
            "silence_duration_ms": ("min_silence_s", 1e-3),
        }
        for key, raw in value.items():
            if key == "type":
                continue
            if key == "prefix_padding_ms" and isinstance(raw, int | float) and 0 <= raw <= 2000:
                preroll_s = float(raw) / 1000
                continue
            if key not in fields or not isinstance(raw, int | float) or isinstance(raw, bool):
                raise StreamError(f"bad vad field {key!r}", "invalid_value",
                                  param=f"session.vad.{key}")  # fmt: skip
            name, scale = fields[key]
            changes[name] = float(raw) * scale
        try:
            return True, replace(current, **changes, neg_threshold=None), preroll_s
        except ValueError as e:
            raise StreamError(str(e), "invalid_value", param="session.vad") from e

    def _session_json(self) -> dict[str, Any]:
        return {**self.config, "step_s": self.options.step_s}

    def _start_session(self) -> StreamingSession:
        if self.session is None:
            self.pcm = PcmInput(self.config["encoding"], self.config["sample_rate"])
            self.session = StreamingSession(
                self.model.transcriber,
                self.options,
                self.vad_model if self.options.vad is not None else None,
                self._post_event,
            )
            log.info("live session started: %s", self._session_json())
        return self.session

    # ---- events ---------------------------------------------------------------------------
    def _post_event(self, event: StreamEvent) -> None:
        """Called on worker threads: hand the event to the loop."""
        with contextlib.suppress(RuntimeError):  # loop closed
            self.loop.call_soon_threadsafe(self.outbox.put, event_json(event))

    async def _sender(self) -> None:
        while True:
            item = await self.outbox.get()
            await self.ws.send_text(json.dumps(item, ensure_ascii=False))

    async def _drain_outbox(self, timeout: float = 10.0) -> None:
        deadline = self.loop.time() + timeout
        while not self.outbox.empty() and self.loop.time() < deadline:
            await asyncio.sleep(0.01)

    # ---- processing -----------------------------------------------------------------------
    async def _processor(self) -> None:
        """Runs the session's work whenever woken: VAD/admission on a thread, passes on the
        pool. Sets `finished` once closing and everything is done."""
        while True:
            await self.wake.wait()
            self.wake.clear()
            session = self.session
            if session is not None:
                while await asyncio.to_thread(session.advance):
                    await self._decode(session)
            if self.closing and (session is None or session.idle):
                self.finished.set()
                return

    async def _decode(self, session: StreamingSession) -> None:
        while True:
            try:
                await self.pool.run(lambda: session.decode(self.cancel), self.cancel)
                return
            except QueueFullError:
                await asyncio.sleep(QUEUE_RETRY_S)  # the audio waits in the inbox; retry
            except PoolClosedError as e:
                raise StreamError(
                    "the server is shutting down", "shutting_down", close=CLOSE_TRY_AGAIN,
                    type_="server_error",
                ) from e  # fmt: skip

    # ---- receiving ------------------------------------------------------------------------
    async def run(self) -> None:
        self.outbox.put({"type": "session.created", "session": self._session_json()})
        sender = asyncio.create_task(self._sender(), name="stream-sender")
        processor = asyncio.create_task(self._processor(), name="stream-processor")
        close_code, reason = CLOSE_NORMAL, "done"
        try:
            close_code, reason = await self._receive_loop(processor)
        except WebSocketDisconnect:
            close_code = 0
        except StreamError as e:
            self.outbox.put(e.event())
            close_code, reason = e.close or CLOSE_POLICY, e.code
        except Exception as e:
            log.error("live session failed", exc_info=e)
            self.outbox.put(error_event("internal error", "internal_error", type_="server_error"))
            close_code, reason = CLOSE_INTERNAL, "internal_error"
        finally:
            self.cancel.set()
            if not processor.done():
                processor.cancel()
            with contextlib.suppress(BaseException):
                await processor
        if close_code and self.ws.client_state == WebSocketState.CONNECTED:
            await self._drain_outbox()
            with contextlib.suppress(Exception):
                await self.ws.close(code=close_code, reason=reason)
        sender.cancel()
        with contextlib.suppress(BaseException):
            await sender
        if self.session is not None:
            stats = self.session.stats()
            log.info(
                "live session closed (%s): %.1f s audio, %d words, %d passes (%d dropped), "
                "decode %.2f s",
                reason, stats.received_s, stats.committed_words, stats.passes,
                stats.skipped_passes, stats.decode_s,
            )  # fmt: skip

    async def _receive_loop(self, processor: asyncio.Task) -> tuple[int, str]:
        """Handle messages until session.close (returns the close code) or a limit. At server
        shutdown the session ends as on session.close (final pass, transcript.text.done), with
        close code 1001 (going away)."""
        idle = self.settings.stream_idle_timeout_s
        shutdown = asyncio.ensure_future(self.drain.wait())
        try:
            return await self._receive_until_closed(processor, shutdown, idle)
        finally:
            shutdown.cancel()

    async def _receive_until_closed(
        self, processor: asyncio.Task, shutdown: asyncio.Future, idle: float
    ) -> tuple[int, str]:
        while True:
            receive = asyncio.ensure_future(self.ws.receive())
            done, _ = await asyncio.wait({receive, processor, shutdown}, timeout=idle,
                                         return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
            if shutdown in done:
                receive.cancel()
                await self._close_session(processor)
                return CLOSE_GOING_AWAY, "server shutting down"
            if processor in done:  # the processing task failed
                receive.cancel()
                processor.result()  # raises its error
                raise RuntimeError("stream processor stopped")
            if receive not in done:
                receive.cancel()
                raise StreamError(
                    f"no message for {idle:g} s: closing the idle session", "idle_timeout",
                    close=CLOSE_POLICY,
                )  # fmt: skip
            message = receive.result()
            if message["type"] == "websocket.disconnect":
                raise WebSocketDisconnect(message.get("code", 1000))
            try:
                if await self._handle(message):
                    return await self._close_session(processor)
            except StreamError as e:
                if e.close is not None:
                    raise
                self.outbox.put(e.event())

    async def _handle(self, message: dict[str, Any]) -> bool:
        """One client message; True when the client asked to close."""
        match parse_client_message(message, self.max_frame):
            case AudioAppend(data=data):
                self._append(data)
            case SessionUpdate(patch=patch):
                self._update(patch)
                self.outbox.put({"type": "session.updated", "session": self._session_json()})
            case BufferCommit():
                self._flush(last=False)
            case SessionClose():
                return True
        return False

    def _append(self, data: bytes) -> None:
        session = self._start_session()
        assert self.pcm is not None
        try:
            audio = self.pcm.convert(data)
        except AudioDecodeError as e:
            raise StreamError(f"audio frame dropped: {e}", "invalid_audio") from e
        session.append(audio)
        if session.received_s > self.settings.stream_max_session_s:
            raise StreamError(
                f"the session passed the limit of {self.settings.stream_max_session_s:g} s of "
                "audio", "session_too_long", close=CLOSE_POLICY,
            )  # fmt: skip
        if session.inbox_s > self.settings.stream_max_buffered_s:
            raise StreamError(
                f"more than {self.settings.stream_max_buffered_s:g} s of audio are waiting to be "
                "transcribed: send audio at most as fast as it is transcribed",
                "buffer_overflow", close=CLOSE_POLICY,
            )  # fmt: skip
        self.wake.set()

    def _flush(self, *, last: bool) -> None:
        """Finalize what was sent; `last`: the stream ends, so the resampler is drained too
        (after a commit it keeps its few milliseconds of delay for the audio that follows)."""
        if self.session is None:
            return
        assert self.pcm is not None
        if last:
            self.session.append(self.pcm.finish())
        self.session.flush()
        self.wake.set()

    async def _close_session(self, processor: asyncio.Task) -> tuple[int, str]:
        self._flush(last=True)
        self.closing = True
        self.wake.set()
        finished = asyncio.ensure_future(self.finished.wait())
        done, _ = await asyncio.wait({finished, processor}, timeout=FINISH_TIMEOUT_S,
                                     return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        if finished not in done:
            finished.cancel()
            if processor in done:
                processor.result()
            raise StreamError("finalizing took too long", "timeout", close=CLOSE_INTERNAL,
                              type_="server_error")  # fmt: skip
        text = self.session.text if self.session is not None else ""
        self.outbox.put({"type": "transcript.text.done", "text": text})
        return CLOSE_NORMAL, "session closed"


__all__ = ["TranscriptionCancelled", "router"]
