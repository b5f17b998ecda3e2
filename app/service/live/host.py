"""The live host: what every live protocol (the Realtime protocol, the own WebSocket, Wyoming)
needs of the server, whatever its wire. The protocol adapters translate between their wire
events and these:

    admit()      -> an `Admission` (counted, its models leased) or `Rejected`: the server gate's
                    refusal of a session (loading, failed, shutting down), too_many_sessions
                    (busy, STT_STREAM_MAX_SESSIONS)
    start()      -> a started `LiveRunner` on the shared pool with the server's limits, the VAD
                    model when the options ask for speech detection
    ending()     -> how a `Rejected` ends a session (`CLOSES`: the limit -> close-reason table);
                    None: the error is reported and the session goes on
    Outbox       -> the one queue of events to the connection (one sender drains it)
    drain/none() -> the shutdown's signal to end the sessions, and the wait until none is open

Event loop only.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Generic, Literal, TypeVar

from app.service.errors import Rejected
from app.service.gate import ServerGate
from app.service.live.events import StreamEvent
from app.service.live.options import StreamingOptions
from app.service.live.pcm import PcmInput
from app.service.live.runner import LiveLimits, LiveRunner
from app.service.models.leases import SessionModels
from app.service.models.loaded import LoadedModel
from app.service.models.manager import ModelManager
from app.service.pool import WorkerPool

T = TypeVar("T")
Ending = Literal["policy", "too_big", "try_again", "internal"]

CLOSES: dict[str, Ending] = {
    # the client's doing: it broke a rule of the session
    "invalid_api_key": "policy",
    "idle_timeout": "policy",
    "session_too_long": "policy",
    "buffer_overflow": "policy",
    "message_too_large": "too_big",
    # the server cannot serve now: come back later
    "loading": "try_again",
    "shutting_down": "try_again",
    "model_load_failed": "internal",
    "too_many_sessions": "try_again",
    # the server failed the session
    "timeout": "internal",
    "internal_error": "internal",
}


def ending(error: Rejected) -> Ending | None:
    """How `error` ends a live session (`CLOSES`); None: report it, the session goes on."""
    return CLOSES.get(error.code)


class Outbox(Generic[T]):
    """Events waiting to be sent to one connection. A replaceable event replaces a waiting
    replaceable event of the same type (only the newest partial matters)."""

    def __init__(self) -> None:
        self._items: deque[tuple[T, bool]] = deque()
        self._ready = asyncio.Event()
        self._idle = asyncio.Event()  # everything put was sent
        self._idle.set()

    def put(self, event: T, *, replaceable: bool = False) -> None:
        self._idle.clear()
        last = self._items[-1] if self._items else None
        if replaceable and last is not None and last[1] and type(last[0]) is type(event):
            self._items[-1] = (event, True)
        else:
            self._items.append((event, replaceable))
        self._ready.set()

    async def get(self) -> T:
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        return self._items.popleft()[0]

    def sent(self) -> None:
        """The sender sent the event it got last."""
        if not self._items:
            self._idle.set()

    async def wait_sent(self, sender: asyncio.Future[None], timeout: float = 10.0) -> None:
        """Until every event put was sent, or the `sender` stopped (the client is gone)."""
        idle = asyncio.ensure_future(self._idle.wait())
        await asyncio.wait({idle, sender}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        idle.cancel()


class Admission:
    """One admitted live session: counted by the host and its models leased until `close()`."""

    def __init__(self, host: LiveHost) -> None:
        self.host = host
        self.models = SessionModels(host.models)
        self._open = True

    def close(self) -> None:
        """Give the models back and leave the count (idempotent)."""
        if self._open:
            self._open = False
            self.models.close()
            self.host._left()

    def __enter__(self) -> Admission:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


class LiveHost:
    """The live sessions of one server; see the module docstring."""

    def __init__(
        self,
        models: ModelManager,
        pool: WorkerPool,
        gate: ServerGate,
        limits: LiveLimits,
        max_sessions: int,
    ) -> None:
        self.models = models
        self.pool = pool
        self.gate = gate
        self.limits = limits
        self.max_sessions = max_sessions
        self.count = 0
        self.drain = asyncio.Event()  # set at shutdown: sessions end as if the client closed them
        self._none = asyncio.Event()
        self._none.set()

    # ---- admission ----------------------------------------------------------------------
    def refusal(self) -> Rejected | None:
        """Why a new session cannot start now; None when it can."""
        refusal, most = self.gate.refusal("session"), self.max_sessions
        if refusal is not None:
            return refusal
        if self.count >= most:
            return Rejected(
                "too_many_sessions", f"too many live sessions ({most}); retry later", kind="busy"
            )
        return None

    def admit(self) -> Admission:
        """Count a new session in; raises the refusal (`Rejected`)."""
        refusal = self.refusal()
        if refusal is not None:
            raise refusal
        self.count += 1
        self._none.clear()
        return Admission(self)

    def _left(self) -> None:
        self.count -= 1
        if not self.count:
            self._none.set()

    async def none(self) -> None:
        """Return once no session is open (the shutdown waits on it)."""
        await self._none.wait()

    # ---- sessions -----------------------------------------------------------------------
    def start(
        self,
        model: LoadedModel,
        options: StreamingOptions,
        pcm: PcmInput,
        on_event: Callable[[StreamEvent], None],
        hear_at_once: bool = False,
    ) -> LiveRunner:
        """A started runner of one session on the shared pool, with the server's limits
        (`hear_at_once`: see `LiveRunner`)."""
        vad = self.models.vad if options.vad is not None else None
        turn = self.models.turn_model if options.turn is not None else None
        return LiveRunner(
            model.transcriber, options, vad, pcm, self.pool, self.limits, on_event, hear_at_once,
            turn_model=turn,
        )  # fmt: skip
