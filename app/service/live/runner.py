"""Drives one live session from the event loop: the loop every live protocol shares.

    client audio -> append() -> session inbox; wake both
    _listen():   (only with `hear_at_once`) woken -> listen() on a helper thread: the VAD hears
                 the audio as it arrives, while a pass decodes (`VoiceActivity` events at once,
                 for a Wyoming utterance's early pass)
    _process():  woken -> advance() on a helper thread (the VAD over what it has not heard yet,
                         admission, applying the VAD's events)
                         -> decode() on the shared worker pool while a pass is due
    close():     flush (the resampler drained too), then wait until the session is idle

The session's events are handed to `on_event` on the event loop, in order (`to_loop`). A pass
runs as a `JobRun` on the worker pool; one the pool has no room for waits until a job finishes
and is tried again (the audio waits in the inbox and the next pass covers it); a closed pool
(server shutdown) ends the session with `PoolClosedError`. The limits (`LiveLimits`) are
checked as audio arrives (`Rejected`, kind "limit").

Adapters read `received_s`, `stats()` and `done` (the processing ended: its error, if any, is
raised by awaiting it) and may await `heard()`; they never reach into the session or the task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from app.engine.turn import TurnModel
from app.engine.vad import SileroVad
from app.service.errors import Rejected
from app.service.job_run import JobRun, to_loop
from app.service.live.events import StreamEvent, StreamStats
from app.service.live.options import StreamingOptions
from app.service.live.pcm import PcmInput
from app.service.live.session import StreamingSession
from app.service.pool import QueueFullError, WorkerPool
from app.service.transcription.transcriber import Transcriber

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LiveLimits:
    """max_session_s: most audio one session may send; max_buffered_s: most audio waiting to
    be transcribed; finish_timeout_s: most time a close may take to finalize."""

    max_session_s: float = 3600.0
    max_buffered_s: float = 60.0
    finish_timeout_s: float = 120.0


class LiveRunner:
    """One session's work; create on the event loop (its processing starts at once)."""

    def __init__(
        self,
        transcriber: Transcriber,
        options: StreamingOptions,
        vad: SileroVad | None,
        pcm: PcmInput,
        pool: WorkerPool,
        limits: LiveLimits,
        on_event: Callable[[StreamEvent], None],
        hear_at_once: bool = False,
        turn_model: TurnModel | None = None,
    ) -> None:
        """hear_at_once: run the VAD as audio arrives, beside a decoding pass, not only at
        admission between passes. On 2 cores that third thread slows the pass: the Realtime
        protocol's median commit latency rose 0.05-0.14 s with it (stream_latency, tiny.en and
        base); only what must hear a pause at once (a Wyoming utterance) asks for it."""
        self._session = StreamingSession(
            transcriber, options, vad, to_loop(on_event), turn_model=turn_model
        )
        self._pcm = pcm
        self._pool = pool
        self._limits = limits
        self._wake = asyncio.Event()
        self._finished = asyncio.Event()
        self._closing = False
        self._to_hear = asyncio.Event()
        self._task = asyncio.create_task(self._process(), name="live-session")
        self._listener = (
            asyncio.create_task(self._listen(), name="live-vad") if hear_at_once else None
        )
        if self._listener is not None:
            self._task.add_done_callback(lambda _task: self._listener.cancel())

    @property
    def done(self) -> asyncio.Future[None]:
        """Done when the processing ended: with its error, or after `close()` finished."""
        return self._task

    @property
    def received_s(self) -> float:
        """Stream seconds of audio the session has received (cleared audio included)."""
        return self._session.received_s

    @property
    def language(self) -> str | None:
        """The language the session reads in (None until the first pass detected it)."""
        return self._session.language

    def stats(self) -> StreamStats:
        return self._session.stats()

    # ---- input (event loop) -----------------------------------------------------------------
    def append(self, data: bytes) -> None:
        """Raw client audio. Raises AudioDecodeError (the chunk is dropped) or `Rejected` (a
        limit)."""
        self.feed(self.convert(data))

    def convert(self, data: bytes) -> np.ndarray:
        """Raw client audio -> f32 16 kHz samples (once per chunk: a caller that keeps the
        audio too, such as a Wyoming utterance, feeds these). Raises AudioDecodeError."""
        return self._pcm.convert(data)

    def feed(self, samples: np.ndarray) -> None:
        """Converted audio into the session. Raises `Rejected` (kind "limit")."""
        self._session.append(samples)
        limits = self._limits
        if self._session.received_s > limits.max_session_s:
            raise Rejected(
                "session_too_long",
                f"the session passed the limit of {limits.max_session_s:g} s of audio",
                kind="limit",
            )
        if self._session.inbox_s > limits.max_buffered_s:
            raise Rejected(
                "buffer_overflow",
                f"more than {limits.max_buffered_s:g} s of audio are waiting to be transcribed: "
                "send audio at most as fast as it is transcribed",
                kind="limit",
            )
        self._to_hear.set()
        self._wake.set()

    async def heard(self) -> None:
        """Returns once the VAD heard all the audio fed so far (its `VoiceActivity` events were
        handed to `on_event` before)."""
        await asyncio.to_thread(self._session.listen)

    def commit(self) -> None:
        """Finalize what was sent (the resampler keeps its few ms of delay for what follows)."""
        self._session.flush()
        self._wake.set()

    def clear(self) -> None:
        self._session.clear()
        self._wake.set()

    async def close(self) -> str:
        """Finalize everything (the resampler drained too) and return the whole text. Raises
        `Rejected` ("timeout") when finalizing takes longer than `finish_timeout_s`, or the
        error that stopped the processing."""
        self._session.append(self._pcm.finish())
        self._session.flush()
        self._closing = True
        self._wake.set()
        finished = asyncio.ensure_future(self._finished.wait())
        done, _ = await asyncio.wait(
            {finished, self._task},
            timeout=self._limits.finish_timeout_s,
            return_when=asyncio.FIRST_COMPLETED,
        )
        if finished not in done:
            finished.cancel()
            if self._task in done:
                self._task.result()
            raise Rejected("timeout", "finalizing took too long", kind="unavailable")
        return self._session.text

    async def stop(self) -> None:
        """Stop at once (the client left, the session failed or is replaced): a pass that runs
        stops at its next decoder step (its job run is cancelled with the task)."""
        if self._listener is not None:
            self._listener.cancel()
        self._task.cancel()
        with contextlib.suppress(BaseException):
            await self._task

    # ---- processing -------------------------------------------------------------------------
    async def _process(self) -> None:
        """Runs the session's work whenever woken; sets `_finished` once closing and idle."""
        session = self._session
        while True:
            await self._wake.wait()
            self._wake.clear()
            while await asyncio.to_thread(session.advance):
                await self._decode()
            if self._closing and session.idle:
                self._finished.set()
                return

    async def _listen(self) -> None:
        """Runs the VAD over the audio as it arrives (an error stops the session's processing
        when its admission meets it)."""
        while True:
            await self._to_hear.wait()
            self._to_hear.clear()
            try:
                await asyncio.to_thread(self._session.listen)
            except Exception:
                log.exception("live session: the VAD failed")
                return

    async def _decode(self) -> None:
        while True:
            try:
                run = JobRun(
                    self._pool, None, lambda _post, cancel: self._session.start_decode(cancel)
                )
                await run.result()
                return
            except QueueFullError:
                await self._pool.room()  # the audio waits in the inbox; retry
