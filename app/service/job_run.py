"""One job on the worker pool, seen from the event loop: what every REST route runs.

    run = JobRun(pool, lease, work)   # submitted now: QueueFullError / PoolClosedError at once
    event = await run.next()          # what `work` posted, in order; ENDED once it ended
    result = await run.result()       # its result or its error
    run.cancel()                      # dropped if waiting, stopped between steps if running

`work(post, cancel)` runs on a worker thread: `post(event)` hands an event to the loop
(`to_loop`, the one bridge from worker threads to the event loop), `cancel` is set when the run
is cancelled.
The model lease goes back when the job is over (or dropped), not when the caller returns.
Awaiting `result()` or `next()` in a task that is cancelled cancels the job.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Generic, TypeVar

from app.service.models.leases import Lease
from app.service.pool import WorkerPool

E = TypeVar("E")
R = TypeVar("R")
Work = Callable[[Callable[[E], None], threading.Event], R]


class Ended:
    """`next()`'s answer once the job is over and every event it posted was taken."""


ENDED = Ended()


class JobRun(Generic[E, R]):
    def __init__(self, pool: WorkerPool, lease: Lease | None, work: Work[E, R]) -> None:
        self._events: asyncio.Queue[E | Ended] = asyncio.Queue()
        self._cancel = threading.Event()
        self.queue_wait_s = 0.0  # from submission to a worker taking the job
        submitted = time.perf_counter()
        # the future's callbacks hold the loop and the queue, never this run: a cycle through the
        # future would keep the job's lease, and so its model, alive until a gc pass
        post = to_loop(self._events.put_nowait)

        def run() -> R:
            self.queue_wait_s = time.perf_counter() - submitted
            return work(post, self._cancel)

        self._future: Future[R] = pool.submit(run)
        if lease is not None:
            lease.release_after(self._future)
        self._future.add_done_callback(lambda _f: post(ENDED))

    @property
    def done(self) -> bool:
        return self._future.done()

    def error(self) -> BaseException | None:
        """The job's error once it is done (None: it succeeded)."""
        return self._future.exception()

    def cancel(self) -> None:
        self._cancel.set()
        self._future.cancel()

    async def next(self) -> E | Ended:
        """The next event the job posted, or `ENDED`."""
        try:
            return await self._events.get()
        except asyncio.CancelledError:
            self.cancel()
            raise

    async def result(self) -> R:
        try:
            return await asyncio.wrap_future(self._future)
        except asyncio.CancelledError:
            self.cancel()
            raise


def to_loop(callback: Callable[[E], object]) -> Callable[[E], None]:
    """`callback` for other threads: called with their argument on the running event loop (call
    this on the loop), in order; dropped once the loop has closed (shutdown)."""
    return functools.partial(_call_on, asyncio.get_running_loop(), callback)


def _call_on(loop: asyncio.AbstractEventLoop, callback: Callable, arg: object) -> None:
    with contextlib.suppress(RuntimeError):  # the loop closed at shutdown
        loop.call_soon_threadsafe(callback, arg)
