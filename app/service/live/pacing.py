"""Audio reaches a live session no faster than it was spoken.

A live session is for audio that arrives as it is spoken: each pass reads the words so far.
A client may instead send a recording in one burst and stop at once (a benchmark, a client
replaying a file); passes on that burst are wasted work that competes with the transcription
the client waits for. `RealTimeFeed` hands the session (and whatever else reacts to the audio as
it is spoken: the Wyoming utterance's pause detector) the audio at most `lead_s` ahead of real
time since the first chunk; audio sent live passes straight through.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable, Sized
from typing import Generic, TypeVar

Chunk = TypeVar("Chunk", bound=Sized)


class RealTimeFeed(Generic[Chunk]):
    """Feeds `sink` (e.g. `LiveRunner.feed`) from a queue at real-time pace; event loop only.

    Chunks are anything with a length (bytes, f32 samples); `per_s`: that length per second of
    sound. An error of `sink` (a session limit) stops the feed and is raised by the next
    `check()`.
    """

    def __init__(self, sink: Callable[[Chunk], None], per_s: int, lead_s: float = 0.5) -> None:
        self.sink = sink
        self.per_s = per_s
        self.lead_s = lead_s
        self._queue: deque[Chunk] = deque()
        self._fed = 0  # length handed to the sink
        self._loop = asyncio.get_running_loop()
        self._started = self._loop.time()
        self._more = asyncio.Event()
        self._error: BaseException | None = None
        self._task = asyncio.create_task(self._run(), name="live-feed")

    def put(self, data: Chunk) -> None:
        self._queue.append(data)
        self._more.set()

    def check(self) -> None:
        """Raise the error that stopped the feed, if any."""
        if self._error is not None:
            raise self._error

    def flush(self) -> None:
        """Hand over everything queued now (the client stopped: no pace to keep)."""
        while self._queue:
            self._append(self._queue.popleft())
        self.check()

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _run(self) -> None:
        while True:
            await self._more.wait()
            self._more.clear()
            while self._queue and self._error is None:
                due = self._started + self._fed / self.per_s - self.lead_s
                delay = due - self._loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)  # the pace itself: a deadline, not a poll
                if self._queue:
                    self._append(self._queue.popleft())

    def _append(self, data: Chunk) -> None:
        self._fed += len(data)
        try:
            self.sink(data)
        except Exception as e:  # a session limit (Rejected): reported by check()
            self._error = e
            self._queue.clear()
