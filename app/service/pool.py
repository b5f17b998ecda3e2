"""Bounded worker pool: the jobs of requests and live passes, never on the event loop.

`workers` jobs run at once; up to `max_queue` more wait. Beyond that `submit` raises
`QueueFullError` (the API answers 429 with `Retry-After`). A job starts on one of `threads`
threads, where its host work runs (decoding an upload, the VAD, the mel); a job whose function
returns a `Future` has handed its model work on (to the model's batching scheduler): its thread
is free at once and the job stays running, holding its place among the `workers`, until that
future is done. A job that is still waiting when its client goes away is dropped; a running one
is stopped through the `threading.Event` its function was given (the transcriber checks it
between decoder steps).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from app.service.errors import Rejected

log = logging.getLogger(__name__)

T = TypeVar("T")


class QueueFullError(Rejected):
    """All workers are busy and the wait queue is full."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__("queue_full", message, kind="busy", retry_after_s=retry_after_s)


class PoolClosedError(Rejected):
    """The pool is shutting down and accepts no more jobs."""

    def __init__(self, message: str) -> None:
        super().__init__("shutting_down", message, kind="unavailable")


@dataclass(frozen=True)
class PoolStats:
    workers: int
    max_queue: int
    active: int  # jobs running: on a thread, or handed on to a model
    queued: int  # jobs accepted and waiting to start


class WorkerPool:
    """`workers` jobs at once on `threads` threads (default: one per job) plus a wait queue of at
    most `max_queue` jobs."""

    def __init__(
        self,
        workers: int,
        max_queue: int,
        *,
        threads: int = 0,
        name: str = "stt-worker",
        on_idle: Callable[[], None] | None = None,
        idle_delay_s: float = 0.0,
    ) -> None:
        """`on_idle` runs once no job has been running or waiting for `idle_delay_s` seconds
        (the server gives its free heap back to the system then: requests that follow each
        other keep reusing the warm heap, an idle server its small footprint), on a timer
        thread; with no delay, as soon as the last job finishes, where its future completes:
        its worker thread, the thread that ended its handed-on work, or the caller's thread for
        a waiting job that was dropped."""
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {max_queue}")
        if not 0 <= threads <= workers:
            raise ValueError(f"threads must be in [0, workers], got {threads}")
        self.workers = workers
        self.max_queue = max_queue
        self.threads = threads or workers
        self._executor = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix=name)
        self._lock = threading.Lock()
        self._pending = 0  # accepted and not finished (running + waiting)
        self._active = 0  # running: on a thread, or handed on (each holds one of the slots)
        self._handed: set[int] = set()  # ids of the futures of work handed on from a thread
        self._slots = threading.Semaphore(workers)
        self._closed = False
        self._on_idle = on_idle
        self._idle_delay_s = idle_delay_s
        self._idle_timer: threading.Timer | None = None  # the wait before `on_idle`
        self._mean_job_s = 2.0  # running mean of job durations, for Retry-After
        self._finish_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    # ---- gauges -----------------------------------------------------------------------------
    @property
    def active(self) -> int:
        return self._active

    @property
    def queued(self) -> int:
        with self._lock:
            return self._pending - self._active

    def stats(self) -> PoolStats:
        with self._lock:
            return PoolStats(
                self.workers, self.max_queue, self._active, self._pending - self._active
            )

    # ---- jobs -------------------------------------------------------------------------------
    def submit(self, fn: Callable[[], T]) -> Future[T]:
        """Accept `fn` or raise `QueueFullError`; the returned future resolves on a worker."""
        with self._lock:
            if self._closed:
                raise PoolClosedError("the server is shutting down")
            if self._full_locked():
                retry = self._retry_after_locked()
                raise QueueFullError(
                    f"server busy: {self._active} transcriptions running and "
                    f"{self._pending - self._active} waiting (limit {self.max_queue}); "
                    f"retry in {retry} s",
                    retry_after_s=retry,
                )
            self._pending += 1
            self._cancel_idle_timer_locked()
        try:
            future = self._executor.submit(self._run, fn)
        except RuntimeError as e:  # executor shut down between the check and here
            with self._lock:
                self._pending -= 1
            raise PoolClosedError("the server is shutting down") from e
        future.add_done_callback(self._finished)
        return future

    async def room(self) -> None:
        """Return once a job could be accepted: at once if the pool has room, else when a job
        finishes (another caller may still take the slot first: `submit` decides). Checked
        under the lock, so jobs that finished after a refusal are not waited for."""
        await self._finish_unless(lambda: not self._full_locked())

    async def drained(self) -> None:
        """Return once no job is running or waiting."""
        while not await self._finish_unless(lambda: self._pending == 0):
            pass

    def shutdown(self, *, wait: bool = True) -> None:
        """Refuse new jobs, drop waiting ones, optionally wait for running ones."""
        with self._lock:
            self._closed = True
            self._cancel_idle_timer_locked()
        self._executor.shutdown(wait=wait, cancel_futures=True)

    # ---- internals --------------------------------------------------------------------------
    def _run(self, fn: Callable[[], T]) -> T:
        self._slots.acquire()  # at most `workers` run: a job handed on keeps its slot
        with self._lock:
            self._active += 1
        t0 = time.perf_counter()
        handed = False
        try:
            result = fn()
            if isinstance(result, Future) and not result.done():
                with self._lock:  # the job goes on without this thread
                    self._handed.add(id(result))
                handed = True
                result.add_done_callback(lambda _f: self._handed_ended(t0))
            return result
        finally:
            if not handed:
                self._stopped(t0)

    def _stopped(self, t0: float) -> None:
        with self._lock:
            self._active -= 1
            self._mean_job_s = 0.8 * self._mean_job_s + 0.2 * (time.perf_counter() - t0)
        self._slots.release()

    def _handed_ended(self, t0: float) -> None:
        self._stopped(t0)
        self._left()

    async def _finish_unless(self, done: Callable[[], bool]) -> bool:
        """True at once when `done()` (checked under the lock, so no finish is missed); else
        wait for the next job to finish and return False."""
        waiter = (asyncio.get_running_loop(), asyncio.Event())
        with self._lock:
            if done():
                return True
            self._finish_waiters.append(waiter)
        try:
            await waiter[1].wait()
        finally:
            with self._lock, contextlib.suppress(ValueError):
                self._finish_waiters.remove(waiter)
        return False

    def _finished(self, future: Future) -> None:
        """The job's future is done: it ran on its thread (or was dropped while waiting); one
        that handed its work on leaves when that work ends (`_handed_ended`)."""
        if not future.cancelled() and future.exception() is None:
            key = id(future.result())
            with self._lock:
                handed = key in self._handed
                self._handed.discard(key)
            if handed:
                return
        self._left()

    def _left(self) -> None:
        """A job is over."""
        with self._lock:
            self._pending -= 1
            idle = self._pending == 0
            waiters, self._finish_waiters = self._finish_waiters, []
        for loop, event in waiters:
            with contextlib.suppress(RuntimeError):  # that loop is closed
                loop.call_soon_threadsafe(event.set)
        if not idle or self._on_idle is None:
            return
        if self._idle_delay_s <= 0:
            self._run_idle_hook()
            return
        with self._lock:
            if self._pending or self._closed:
                return
            self._cancel_idle_timer_locked()
            timer = threading.Timer(self._idle_delay_s, self._idle_for_a_while)
            timer.daemon = True
            self._idle_timer = timer
        timer.start()

    def _idle_for_a_while(self) -> None:
        """The idle timer fired: the hook, unless a job came meanwhile (which cancelled it)."""
        with self._lock:
            if self._idle_timer is not threading.current_thread() or self._pending:
                return
            self._idle_timer = None
        self._run_idle_hook()

    def _cancel_idle_timer_locked(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def _run_idle_hook(self) -> None:
        assert self._on_idle is not None
        try:
            self._on_idle()
        except Exception:  # never the job's error
            log.exception("the pool's idle hook failed")

    def _full_locked(self) -> bool:
        return self._pending >= self.workers + self.max_queue

    def _retry_after_locked(self) -> int:
        """Seconds until a slot is likely free: queue length x mean job time / workers."""
        waits = (self._pending - self.workers + 1) / self.workers
        return max(1, min(120, math.ceil(max(waits, 1.0) * self._mean_job_s)))
