"""One job on the worker pool, seen from the event loop: what every REST route runs.

    run = JobRun(pool, lease, work)   # submitted now: QueueFullError / PoolClosedError at once
    event = await run.next()          # what `work` posted, in order; ENDED once it ended
    result = await run.result()       # its result or its error
    run.cancel()                      # dropped if waiting, stopped between steps if running

`work(post, cancel)` runs on a worker thread: `post(event)` hands an event to the loop
(`to_loop`, the one bridge from worker threads to the event loop), `cancel` is set when the run
is cancelled. `work` may hand its model work on by returning a `Future` (the model's task, see
`app.service.batching.scheduler`): its thread is free at once and the run's result is that
future's.
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
        self._cancel = cancel = threading.Event()
        self._waited = waited = [0.0]  # from submission to a worker taking the job
        submitted = time.perf_counter()
        # the future's callbacks hold the loop and the queue, never this run: a cycle through the
        # future would keep the job's lease, and so its model, alive until a gc pass
        post = to_loop(self._events.put_nowait)

        def run() -> R | Future[R]:  # holds nothing of this run: a worker may keep it a while
            waited[0] = time.perf_counter() - submitted
            return work(post, cancel)

        # the job's end, after any work it handed on; running from the start, so no awaiter's
        # cancellation cancels it (the lease follows it: only the job's real end frees it)
        self._ended: Future[R] = Future()
        self._ended.set_running_or_notify_cancel()
        self._future = pool.submit(run)
        self._future.add_done_callback(functools.partial(_hand_on, self._ended))
        if lease is not None:
            lease.release_after(self._ended)
        self._ended.add_done_callback(lambda _f: post(ENDED))

    @property
    def queue_wait_s(self) -> float:
        """From submission to a worker taking the job."""
        return self._waited[0]

    @property
    def done(self) -> bool:
        return self._ended.done()

    def error(self) -> BaseException | None:
        """The job's error once it is done (None: it succeeded)."""
        return self._ended.exception()

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
            return await asyncio.wrap_future(self._ended)
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


def _hand_on(ended: Future, future: Future) -> None:
    """The job's thread part is over: its result, its error, or the future of the work it
    handed on, whose outcome becomes the job's."""
    handed = not future.cancelled() and future.exception() is None and future.result()
    if isinstance(handed, Future):
        handed.add_done_callback(functools.partial(_copy, ended))
    else:
        _copy(ended, future)


def _copy(ended: Future, future: Future) -> None:
    if future.cancelled():  # dropped before it started (a cancel, or the pool shutting down)
        ended.set_exception(asyncio.CancelledError("the job was dropped before it started"))
    elif (error := future.exception()) is not None:
        ended.set_exception(error)
    else:
        ended.set_result(future.result())
