"""What every live WebSocket protocol shares: admission, the sender, the receive loop, limits.

A protocol adapter (`audio_stream.py`, `realtime.py`) subclasses `LiveConnection` and says how
its messages map to the session (`handle`), how session events become its wire events
(`on_event`) and how it ends (`finish`). Shared here:

- admission (`serve`): the API key (Bearer header, `openai-insecure-api-key.<key>` subprotocol
  or `?api_key=`), models loaded, not shutting down, at most `STT_STREAM_MAX_SESSIONS`; a refusal
  is an `error` event and a close code (1008 key, 1013 try again);
- one sender task per connection (a client that reads slowly holds up only itself; a waiting
  replaceable event, such as a partial, is replaced by the newer one);
- the receive loop: a message larger than `STT_STREAM_MAX_FRAME_KB` (1009), no message for
  `STT_STREAM_IDLE_TIMEOUT_S` (1008), a limit of the session (1008), server shutdown (the session
  is finalized, then 1001), an internal failure (1011). Other bad messages are reported as
  `error` events and the session goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi import WebSocket, WebSocketDisconnect
from pydantic import BaseModel
from starlette.websockets import WebSocketState

from app.api.auth import WS_KEY_SUBPROTOCOL_PREFIX, key_matches, websocket_key
from app.api.live.stream_options import live_defaults
from app.api.services import Services
from app.config import Settings
from app.service.live import (
    LimitExceeded,
    LiveLimits,
    LiveRunner,
    PcmInput,
    SileroVad,
    StreamEvent,
)
from app.service.live.options import LiveDefaults, StreamingOptions
from app.service.model_leases import SessionModels
from app.service.pool import PoolClosedError, WorkerPool
from app.service.registry import LoadedModel

log = logging.getLogger(__name__)

CLOSE_NORMAL = 1000
CLOSE_GOING_AWAY = 1001
CLOSE_POLICY = 1008
CLOSE_TOO_BIG = 1009
CLOSE_INTERNAL = 1011
CLOSE_TRY_AGAIN = 1013


class LiveError(Exception):
    """A problem to report as an `error` event; `close` is the close code, None to go on."""

    def __init__(
        self,
        message: str,
        code: str,
        *,
        param: str | None = None,
        close: int | None = None,
        type_: str = "invalid_request_error",
        event_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.param = param
        self.close = close
        self.type = type_
        self.event_id = event_id


def check_size(size: int, max_bytes: int) -> None:
    if size > max_bytes:
        raise LiveError(
            f"message of {size} bytes is larger than the limit of {max_bytes}",
            "message_too_large", close=CLOSE_TOO_BIG,
        )  # fmt: skip


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def load_json_event(text: str) -> dict[str, Any]:
    """A text frame -> a JSON object with a string `type`; raises LiveError (NaN/Infinity,
    absurd nesting and non-objects included)."""
    try:
        event = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        raise LiveError(
            f"text messages must be JSON events ({e.msg} at {e.pos}); send audio as binary "
            "frames or input_audio_buffer.append", "invalid_json",
        ) from e  # fmt: skip
    except (ValueError, RecursionError) as e:  # NaN, 5000-digit numbers, [[[[... nesting
        raise LiveError(f"text messages must be JSON events ({e})", "invalid_json") from e
    if not isinstance(event, dict) or not isinstance(event.get("type"), str):
        raise LiveError("an event is a JSON object with a string 'type'", "invalid_event")
    return event


@dataclass(frozen=True)
class LiveDeps:
    """What a live connection uses of the app's `Services`."""

    settings: Settings
    registry: SessionModels  # leases every model the session uses until it ends
    pool: WorkerPool
    vad: SileroVad | None
    drain: asyncio.Event  # set at shutdown: sessions end as if the client had closed them

    @property
    def defaults(self) -> LiveDefaults:
        """The server's live settings every session starts from (`stream_options`)."""
        return live_defaults(self.settings, self.registry.base_options, self.vad is not None)

    @property
    def limits(self) -> LiveLimits:
        s = self.settings
        return LiveLimits(max_session_s=s.stream_max_session_s,
                          max_buffered_s=s.stream_max_buffered_s)  # fmt: skip


class Outbox:
    """Events waiting to be sent. A replaceable event replaces a waiting replaceable event of
    the same type (only the newest partial matters)."""

    def __init__(self) -> None:
        self._items: deque[tuple[BaseModel, bool]] = deque()
        self._ready = asyncio.Event()
        self._idle = asyncio.Event()  # everything put was sent
        self._idle.set()

    def put(self, event: BaseModel, *, replaceable: bool = False) -> None:
        self._idle.clear()
        last = self._items[-1] if self._items else None
        if replaceable and last is not None and last[1] and type(last[0]) is type(event):
            self._items[-1] = (event, True)
        else:
            self._items.append((event, replaceable))
        self._ready.set()

    async def get(self) -> BaseModel:
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        return self._items.popleft()[0]

    def sent(self) -> None:
        """The sender sent the event it got last."""
        if not self._items:
            self._idle.set()

    async def wait_idle(self) -> None:
        await self._idle.wait()


ErrorFactory = Callable[[LiveError], BaseModel]


async def serve(
    websocket: WebSocket,
    services: Services,
    error_event: ErrorFactory,
    connection: Callable[[WebSocket, LiveDeps], LiveConnection],
) -> None:
    """Admit the client (see the module docstring), then run its connection."""
    settings = services.settings
    offered = [
        p.strip()
        for p in websocket.headers.get("sec-websocket-protocol", "").split(",")
        if p.strip()
    ]
    plain = [p for p in offered if not p.startswith(WS_KEY_SUBPROTOCOL_PREFIX)]
    await websocket.accept(subprotocol=(plain or offered or [None])[0])

    presented = websocket_key(websocket) or websocket.query_params.get("api_key")
    readiness, sessions = services.readiness, services.live
    refusal: LiveError | None = None
    if not key_matches(settings.api_key, presented):
        message = "Incorrect API key provided." if presented else "You didn't provide an API key."
        refusal = LiveError(message, "invalid_api_key", close=CLOSE_POLICY)
    elif not readiness.ready:
        detail = readiness.error or "the models are still loading; retry shortly"
        refusal = LiveError(detail, "loading", close=CLOSE_TRY_AGAIN, type_="server_error")
    elif sessions.drain.is_set() or readiness.draining:
        refusal = LiveError("the server is shutting down; reconnect", "shutting_down",
                            close=CLOSE_TRY_AGAIN, type_="server_error")  # fmt: skip
    elif sessions.count >= settings.stream_max_sessions:
        refusal = LiveError(
            f"too many live sessions ({settings.stream_max_sessions}); retry later",
            "too_many_sessions", close=CLOSE_TRY_AGAIN, type_="server_error",
        )  # fmt: skip
    if refusal is not None:
        with contextlib.suppress(Exception):
            await websocket.send_text(error_event(refusal).model_dump_json())
            await websocket.close(code=refusal.close or CLOSE_POLICY, reason=refusal.code)
        return
    services.metrics.active_streams.inc()
    try:
        with sessions:
            models = SessionModels(services.models)
            deps = LiveDeps(settings, models, services.pool, models.vad, sessions.drain)
            try:
                await connection(websocket, deps).run()
            finally:
                models.close()
    finally:
        services.metrics.active_streams.dec()


class LiveConnection(ABC):
    """One WebSocket session: receive loop, the session's runner, sender task."""

    def __init__(self, websocket: WebSocket, deps: LiveDeps) -> None:
        self.ws = websocket
        self.deps = deps
        self.settings = deps.settings
        self.outbox = Outbox()
        self.runner: LiveRunner | None = None
        self.max_frame = deps.settings.stream_max_frame_kb * 1024

    # ---- what a protocol says ---------------------------------------------------------------
    @abstractmethod
    def greeting(self) -> BaseModel:
        """The first event (session.created)."""

    @abstractmethod
    async def handle(self, message: dict[str, Any]) -> bool:
        """One `websocket.receive` message; True when the client asked to close. Raises
        LiveError."""

    @abstractmethod
    def error_event(self, error: LiveError) -> BaseModel: ...

    @abstractmethod
    def on_event(self, event: StreamEvent) -> None:
        """A session event (on the event loop): put the wire events in the outbox."""

    @abstractmethod
    async def finish(self) -> None:
        """The session ends (client close or shutdown): finalize and send the last events."""

    def describe(self) -> str:
        return ""

    def failed(self, error: LiveError) -> None:
        """The session ends on `error` (sent next): say which of its results will not come.
        Nothing by default (the own protocol's `transcript.text.done` never comes either)."""
        return

    # ---- the session --------------------------------------------------------------------
    def start_runner(self, model: LoadedModel, options: StreamingOptions, pcm: PcmInput) -> None:
        vad = self.deps.vad if options.vad is not None else None
        self.runner = LiveRunner(
            model.transcriber, options, vad, pcm, self.deps.pool, self.deps.limits, self.on_event
        )
        self.runner.start()
        log.info("live session started: %s", self.describe())

    async def close_runner(self) -> str:
        """Finalize everything; the whole committed text."""
        if self.runner is None:
            return ""
        try:
            return await self.runner.close()
        except LimitExceeded as e:
            raise LiveError(str(e), e.code, close=CLOSE_INTERNAL, type_="server_error") from e

    # ---- the connection -----------------------------------------------------------------
    async def run(self) -> None:
        self.outbox.put(self.greeting())
        sender = asyncio.create_task(self._sender(), name="live-sender")
        close_code, reason = CLOSE_NORMAL, "done"
        try:
            close_code, reason = await self._receive_loop()
        except WebSocketDisconnect:
            close_code = 0
        except LiveError as e:
            self._fail(e)
            close_code, reason = e.close or CLOSE_POLICY, e.code
        except PoolClosedError:
            error = LiveError("the server is shutting down", "shutting_down",
                              close=CLOSE_TRY_AGAIN, type_="server_error")  # fmt: skip
            self._fail(error)
            close_code, reason = CLOSE_TRY_AGAIN, error.code
        except Exception as e:
            log.error("live session failed", exc_info=e)
            error = LiveError("internal error", "internal_error", type_="server_error")
            self._fail(error)
            close_code, reason = CLOSE_INTERNAL, "internal_error"
        finally:
            if self.runner is not None:
                await self.runner.stop()
        if close_code and self.ws.client_state == WebSocketState.CONNECTED:
            await self._drain_outbox(sender)
            with contextlib.suppress(Exception):
                await self.ws.close(code=close_code, reason=reason)
        sender.cancel()
        with contextlib.suppress(BaseException):
            await sender
        if self.runner is not None:
            stats = self.runner.session.stats()
            log.info(
                "live session closed (%s): %.1f s audio, %d words, %d passes (%d dropped), "
                "decode %.2f s",
                reason, stats.received_s, stats.committed_words, stats.passes,
                stats.skipped_passes, stats.decode_s,
            )  # fmt: skip

    def _fail(self, error: LiveError) -> None:
        self.failed(error)
        self.outbox.put(self.error_event(error))

    async def _sender(self) -> None:
        while True:
            event = await self.outbox.get()
            await self.ws.send_text(event.model_dump_json())
            self.outbox.sent()

    async def _drain_outbox(self, sender: asyncio.Task[None], timeout: float = 10.0) -> None:
        """Until every event put was sent (or the sender stopped: the client is gone)."""
        idle = asyncio.ensure_future(self.outbox.wait_idle())
        await asyncio.wait({idle, sender}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        idle.cancel()

    async def _receive_loop(self) -> tuple[int, str]:
        """Handle messages until the client closes (returns the close code) or a limit. At
        server shutdown the session ends as on a client close, with close code 1001."""
        idle = self.settings.stream_idle_timeout_s
        shutdown = asyncio.ensure_future(self.deps.drain.wait())
        try:
            while True:
                receive = asyncio.ensure_future(self.ws.receive())
                waits: set[asyncio.Future[Any]] = {receive, shutdown}
                if self.runner is not None and self.runner.task is not None:
                    waits.add(self.runner.task)
                done, _ = await asyncio.wait(waits, timeout=idle,
                                             return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
                if shutdown in done:
                    receive.cancel()
                    await self.finish()
                    return CLOSE_GOING_AWAY, "server shutting down"
                if receive not in done:
                    receive.cancel()
                    if self.runner is not None and self.runner.task in done:
                        self.runner.task.result()  # raises its error
                        raise RuntimeError("live session processing stopped")
                    raise LiveError(
                        f"no message for {idle:g} s: closing the idle session", "idle_timeout",
                        close=CLOSE_POLICY,
                    )  # fmt: skip
                message = receive.result()
                if message["type"] == "websocket.disconnect":
                    raise WebSocketDisconnect(message.get("code", 1000))
                try:
                    if await self.handle(message):
                        await self.finish()
                        return CLOSE_NORMAL, "session closed"
                except LimitExceeded as e:
                    raise LiveError(str(e), e.code, close=CLOSE_POLICY) from e
                except LiveError as e:
                    if e.close is not None:
                        raise
                    self.outbox.put(self.error_event(e))
        finally:
            shutdown.cancel()
