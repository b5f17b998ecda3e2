"""What every live WebSocket protocol shares: the API key, the sender, the receive loop, and how
a `Rejected` goes on the wire.

A protocol adapter (`audio_stream.py`, `realtime.py`) subclasses `LiveConnection` and says how
its messages map to the session (`handle`), how session events become its wire events
(`on_event`) and how it ends (`finish`). The live host (`app.service.live.host`) admits the
session (models loaded, not shutting down, at most `STT_STREAM_MAX_SESSIONS`), starts its runner
and says which refusals end it (`ending`); here:

- the API key (Bearer header, `openai-insecure-api-key.<key>` subprotocol or `?api_key=`);
- a refusal or an error is an `error` event; one that ends the session is followed by its close
  code (`CLOSE_CODES`: 1008 the client broke a rule (key, idle, a session limit), 1009 a message
  too large, 1013 try again (loading, shutting down, too many sessions), 1011 the server failed);
  others are reported and the session goes on;
- one sender task per connection (a client that reads slowly holds up only itself; a waiting
  replaceable event, such as a partial, is replaced by the newer one);
- the receive loop: a message larger than `STT_STREAM_MAX_FRAME_KB`, no message for
  `STT_STREAM_IDLE_TIMEOUT_S`, a limit of the session, server shutdown (the session is finalized,
  then 1001), an internal failure (1011).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import WebSocket, WebSocketDisconnect
from pydantic import BaseModel
from starlette.websockets import WebSocketState

from app.api.auth import WS_KEY_SUBPROTOCOL_PREFIX, key_refusal
from app.api.live.stream_options import live_defaults
from app.api.services import Services
from app.config import Settings
from app.service.diarize.job import LazyDiarizer
from app.service.errors import Rejected
from app.service.live import (
    Admission,
    LiveHost,
    LiveRunner,
    Outbox,
    PcmInput,
    SileroVad,
    StreamEvent,
    ending,
)
from app.service.live.host import Ending
from app.service.live.options import LiveDefaults, StreamingOptions
from app.service.models.leases import SessionModels
from app.service.models.loaded import LoadedModel
from app.service.voices.registry import VoiceRegistry

log = logging.getLogger(__name__)

CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_POLICY = 1008
CLOSE_TOO_BIG = 1009
CLOSE_INTERNAL = 1011
CLOSE_TRY_AGAIN = 1013
CLOSE_CODES: dict[Ending, int] = {
    "policy": CLOSE_POLICY,
    "too_big": CLOSE_TOO_BIG,
    "try_again": CLOSE_TRY_AGAIN,
    "internal": CLOSE_INTERNAL,
}


def close_code(error: Rejected) -> int | None:
    """The close code that follows `error`'s event; None: the session goes on."""
    how = ending(error)
    return None if how is None else CLOSE_CODES[how]


def check_size(size: int, max_bytes: int) -> None:
    if size > max_bytes:
        raise Rejected(
            "message_too_large",
            f"message of {size} bytes is larger than the limit of {max_bytes}",
            kind="limit",
        )


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def load_json_event(text: str) -> dict[str, Any]:
    """A text frame -> a JSON object with a string `type`; raises Rejected (NaN/Infinity,
    absurd nesting and non-objects included)."""
    try:
        event = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        raise Rejected(
            "invalid_json", f"text messages must be JSON events ({e.msg} at {e.pos}); send audio "
            "as binary frames or input_audio_buffer.append",
        ) from e  # fmt: skip
    except (ValueError, RecursionError) as e:  # NaN, 5000-digit numbers, [[[[... nesting
        raise Rejected("invalid_json", f"text messages must be JSON events ({e})") from e
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        raise Rejected("invalid_event", "an event is a JSON object with a string 'type'")
    return event


@dataclass(frozen=True)
class LiveDeps:
    """What a live connection uses: the server's settings, the live host, its admission (the
    models it leases)."""

    settings: Settings
    host: LiveHost
    admission: Admission
    diarizer: LazyDiarizer | None = None  # the speaker models (live speakers), if served
    voices: VoiceRegistry | None = None  # the enrolled voices they may name

    @property
    def models(self) -> SessionModels:
        """The models this session leases (`Admission.models`)."""
        return self.admission.models

    @property
    def vad(self) -> SileroVad | None:
        return self.models.vad

    @property
    def defaults(self) -> LiveDefaults:
        """The server's live settings every session starts from (`stream_options`)."""
        models = self.models
        return live_defaults(
            self.settings, models.base_options, self.vad is not None, models.turn_model is not None
        )


ErrorFactory = Callable[[Rejected], BaseModel]


def offered_subprotocol(websocket: WebSocket) -> str | None:
    """The subprotocol to accept: the client's first that is not the API key's."""
    offered = [
        p.strip()
        for p in websocket.headers.get("sec-websocket-protocol", "").split(",")
        if p.strip()
    ]
    plain = [p for p in offered if not p.startswith(WS_KEY_SUBPROTOCOL_PREFIX)]
    return (plain or offered or [None])[0]


async def serve(
    websocket: WebSocket,
    services: Services,
    error_event: ErrorFactory,
    connection: Callable[[WebSocket, LiveDeps], LiveConnection],
    *,
    client_secrets: bool = False,
) -> None:
    """Admit the client (the key, or an unexpired client secret where `client_secrets`; then
    the host's admission), then run its connection."""
    settings = services.settings
    await websocket.accept(subprotocol=offered_subprotocol(websocket))
    try:
        refusal = key_refusal(settings.api_key, websocket, client_secrets=client_secrets)
        if refusal is not None:
            raise refusal
        admission = services.live.admit()
    except Rejected as refusal:
        await _refuse(websocket, error_event, refusal)
        return
    services.metrics.active_streams.inc()
    try:
        with admission:
            try:  # the connection takes the default model: it may not be loaded
                deps = LiveDeps(
                    settings, services.live, admission, services.diarizer, services.voices
                )
                live = connection(websocket, deps)
            except Rejected as refusal:
                await _refuse(websocket, error_event, refusal)
                return
            await live.run()
    finally:
        services.metrics.active_streams.dec()


async def _refuse(websocket: WebSocket, error_event: ErrorFactory, refusal: Rejected) -> None:
    with contextlib.suppress(Exception):
        await websocket.send_text(error_event(refusal).model_dump_json())
        await websocket.close(code=close_code(refusal) or CLOSE_POLICY, reason=refusal.code)


class LiveConnection(ABC):
    """One WebSocket session: receive loop, the session's runner, sender task."""

    def __init__(self, websocket: WebSocket, deps: LiveDeps) -> None:
        self.ws = websocket
        self.deps = deps
        self.settings = deps.settings
        self.outbox: Outbox[BaseModel] = Outbox()
        self.runner: LiveRunner | None = None
        self.max_frame = deps.settings.stream_max_frame_kb * 1024

    # ---- what a protocol says ---------------------------------------------------------------
    @abstractmethod
    def greeting(self) -> BaseModel:
        """The first event (session.created)."""

    @abstractmethod
    async def handle(self, message: dict[str, Any]) -> bool:
        """One `websocket.receive` message; True when the client asked to close. Raises
        Rejected."""

    @abstractmethod
    def error_event(self, error: Rejected) -> BaseModel: ...

    @abstractmethod
    def on_event(self, event: StreamEvent) -> None:
        """A session event (on the event loop): put the wire events in the outbox."""

    @abstractmethod
    async def finish(self) -> None:
        """The session ends (client close or shutdown): finalize and send the last events."""

    def describe(self) -> str:
        return ""

    def say(self, error: Rejected) -> None:
        """An error the session goes on after (its `error` event)."""
        self.outbox.put(self.error_event(error))

    def failed(self, error: Rejected) -> None:
        """The session ends on `error` (sent next): say which of its results will not come.
        Nothing by default (the own protocol's `transcript.text.done` never comes either)."""
        return

    # ---- the session --------------------------------------------------------------------
    def start_runner(self, model: LoadedModel, options: StreamingOptions, pcm: PcmInput) -> None:
        self.runner = self.deps.host.start(model, options, pcm, self.on_event)
        log.info("live session started: %s", self.describe())

    async def close_runner(self) -> str:
        """Finalize everything; the whole committed text."""
        return "" if self.runner is None else await self.runner.close()

    # ---- the connection -----------------------------------------------------------------
    async def run(self) -> None:
        self.outbox.put(self.greeting())
        sender = asyncio.create_task(self._sender(), name="live-sender")
        close, reason = CLOSE_NORMAL, "done"
        try:
            close, reason = await self._receive_loop()
        except WebSocketDisconnect:
            close = 0
        except Rejected as e:  # a limit, shutdown (the pool closed), finalizing too long
            self._fail(e)
            close, reason = close_code(e) or CLOSE_INTERNAL, e.code
        except Exception as e:
            log.error("live session failed", exc_info=e)
            error = Rejected("internal_error", "internal error", kind="unavailable")
            self._fail(error)
            close, reason = CLOSE_INTERNAL, error.code
        finally:
            if self.runner is not None:
                await self.runner.stop()
        if close and self.ws.client_state == WebSocketState.CONNECTED:
            await self.outbox.wait_sent(sender)
            with contextlib.suppress(Exception):
                await self.ws.close(code=close, reason=reason)
        sender.cancel()
        with contextlib.suppress(BaseException):
            await sender
        if self.runner is not None:
            stats = self.runner.stats()
            log.info(
                "live session closed (%s): %.1f s audio, %d words, %d passes (%d dropped), "
                "decode %.2f s",
                reason, stats.received_s, stats.committed_words, stats.passes,
                stats.skipped_passes, stats.decode_s,
            )  # fmt: skip

    async def _finish_reading(self, receive: asyncio.Future[Any]) -> None:
        """Finish at shutdown while still reading the socket. The client sends until it sees
        the close, and a socket nobody reads stops answering its pings: after the keepalive's
        timeout the connection fails with 1011 and the final events are lost (a drain's last
        pass can take tens of seconds). What arrives now is not transcribed: the session ends
        at the signal, as if the client had closed it then."""
        finishing = asyncio.ensure_future(self.finish())
        unread = 0
        try:
            while not finishing.done():
                await asyncio.wait({finishing, receive}, return_when=asyncio.FIRST_COMPLETED)
                if not receive.done():
                    continue
                message = receive.result()
                if message["type"] == "websocket.disconnect":
                    await finishing
                    raise WebSocketDisconnect(message.get("code", 1000))
                unread += 1
                receive = asyncio.ensure_future(self.ws.receive())
        finally:
            receive.cancel()
        finishing.result()
        if unread:
            log.info("live session: %d message(s) after the shutdown began were not read", unread)

    def _fail(self, error: Rejected) -> None:
        self.failed(error)
        self.outbox.put(self.error_event(error))

    async def _sender(self) -> None:
        while True:
            event = await self.outbox.get()
            await self.ws.send_text(event.model_dump_json())
            self.outbox.sent()

    async def _receive_loop(self) -> tuple[int, str]:
        """Handle messages until the client closes (returns the close code) or a refusal that
        ends the session. At server shutdown the session ends as on a client close, with close
        code 1001."""
        idle = self.settings.stream_idle_timeout_s
        shutdown = asyncio.ensure_future(self.deps.host.drain.wait())
        try:
            while True:
                receive = asyncio.ensure_future(self.ws.receive())
                waits: set[asyncio.Future[Any]] = {receive, shutdown}
                if self.runner is not None:
                    waits.add(self.runner.done)
                done, _ = await asyncio.wait(waits, timeout=idle,
                                             return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
                if shutdown in done:
                    await self._finish_reading(receive)
                    return CLOSE_GOING_AWAY, "server shutting down"
                if receive not in done:
                    receive.cancel()
                    if self.runner is not None and self.runner.done in done:
                        self.runner.done.result()  # raises its error
                        raise RuntimeError("live session processing stopped")
                    raise Rejected(
                        "idle_timeout", f"no message for {idle:g} s: closing the idle session",
                        kind="limit",
                    )  # fmt: skip
                message = receive.result()
                if message["type"] == "websocket.disconnect":
                    raise WebSocketDisconnect(message.get("code", 1000))
                try:
                    if await self.handle(message):
                        await self.finish()
                        return CLOSE_NORMAL, "session closed"
                except Rejected as e:
                    if ending(e) is not None:
                        raise
                    self.outbox.put(self.error_event(e))
        finally:
            shutdown.cancel()
