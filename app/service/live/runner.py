"""Drives one live session from the event loop: the loop every live protocol shares.

    client audio -> append() -> session inbox; wake
    _process():  woken -> advance() on a helper thread (VAD, admission)
                         -> decode() on the shared worker pool while a pass is due
    close():     flush (the resampler drained too), then wait until the session is idle

The session's events are handed to `on_event` on the event loop, in order. A pass the pool has
no room for waits until a job finishes and is tried again (the audio waits in the inbox and the
next pass covers it); a closed pool (server shutdown) ends the session with `PoolClosedError`. The
limits (`LiveLimits`) are checked as audio arrives (`LimitExceeded`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from app.engine.vad import SileroVad
from app.service.live.events import StreamEvent
from app.service.live.options import StreamingOptions
from app.service.live.pcm import PcmInput
from app.service.live.session import StreamingSession
from app.service.pool import QueueFullError, WorkerPool
from app.service.transcriber import Transcriber

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LiveLimits:
    """max_session_s: most audio one session may send; max_buffered_s: most audio waiting to
    be transcribed; finish_timeout_s: most time a close may take to finalize."""

    max_session_s: float = 3600.0
    max_buffered_s: float = 60.0
    finish_timeout_s: float = 120.0


class LimitExceeded(Exception):
    """A `LiveLimits` limit was passed; `code` names it (session_too_long, buffer_overflow,
    timeout)."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class LiveRunner:
    """One session's work; create on the event loop, then `start()`."""

    def __init__(
        self,
        transcriber: Transcriber,
        options: StreamingOptions,
        vad: SileroVad | None,
        pcm: PcmInput,
        pool: WorkerPool,
        limits: LiveLimits,
        on_event: Callable[[StreamEvent], None],
    ) -> None:
        self.loop = asyncio.get_running_loop()
        self.on_event = on_event
        self.session = StreamingSession(transcriber, options, vad, self._post)
        self.pcm = pcm
        self.pool = pool
        self.limits = limits
        self.cancel = threading.Event()
        self._wake = asyncio.Event()
        self._finished = asyncio.Event()
        self._closing = False
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._process(), name="live-session")

    def _post(self, event: StreamEvent) -> None:
        """Called on worker threads: hand the event to the loop."""
        with contextlib.suppress(RuntimeError):  # loop closed
            self.loop.call_soon_threadsafe(self.on_event, event)

    # ---- input (event loop) -----------------------------------------------------------------
    def append(self, data: bytes) -> None:
        """Raw client audio. Raises AudioDecodeError (the chunk is dropped) or LimitExceeded."""
        self.session.append(self.pcm.convert(data))
        if self.session.received_s > self.limits.max_session_s:
            raise LimitExceeded(
                f"the session passed the limit of {self.limits.max_session_s:g} s of audio",
                "session_too_long",
            )
        if self.session.inbox_s > self.limits.max_buffered_s:
            raise LimitExceeded(
                f"more than {self.limits.max_buffered_s:g} s of audio are waiting to be "
                "transcribed: send audio at most as fast as it is transcribed",
                "buffer_overflow",
            )
        self._wake.set()

    def commit(self) -> None:
        """Finalize what was sent (the resampler keeps its few ms of delay for what follows)."""
        self.session.flush()
        self._wake.set()

    def clear(self) -> None:
        self.session.clear()
        self._wake.set()

    async def close(self) -> str:
        """Finalize everything (the resampler drained too) and return the whole text. Raises
        LimitExceeded when finalizing takes longer than `finish_timeout_s`, or the error that
        stopped the processing."""
        self.session.append(self.pcm.finish())
        self.session.flush()
        self._closing = True
        self._wake.set()
        assert self.task is not None
        finished = asyncio.ensure_future(self._finished.wait())
        done, _ = await asyncio.wait(
            {finished, self.task},
            timeout=self.limits.finish_timeout_s,
            return_when=asyncio.FIRST_COMPLETED,
        )
        if finished not in done:
            finished.cancel()
            if self.task in done:
                self.task.result()
            raise LimitExceeded("finalizing took too long", "timeout")
        return self.session.text

    async def stop(self) -> None:
        """Stop at once (the client left or the session failed)."""
        self.cancel.set()
        if self.task is not None and not self.task.done():
            self.task.cancel()
        if self.task is not None:
            with contextlib.suppress(BaseException):
                await self.task

    # ---- processing -------------------------------------------------------------------------
    async def _process(self) -> None:
        """Runs the session's work whenever woken; sets `_finished` once closing and idle."""
        session = self.session
        while True:
            await self._wake.wait()
            self._wake.clear()
            while await asyncio.to_thread(session.advance):
                await self._decode()
            if self._closing and session.idle:
                self._finished.set()
                return

    async def _decode(self) -> None:
        while True:
            try:
                await self.pool.run(lambda: self.session.decode(self.cancel), self.cancel)
                return
            except QueueFullError:
                await self.pool.room()  # the audio waits in the inbox; retry
