"""A job run (`app.service.job_run.JobRun`) on a real worker pool, from the event loop: the
events it posts arrive in order and end with `ENDED`, its result or error is awaited, a full
queue refuses it at once, cancelling stops a running job or drops a waiting one, and a job that
hands its work on ends with that work."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from concurrent.futures import Future

import pytest

from app.service.job_run import ENDED, JobRun
from app.service.pool import QueueFullError, WorkerPool


def test_the_events_arrive_in_order_then_the_result() -> None:
    def work(post, _cancel) -> int:
        for i in range(5):
            post(i)
        return 42

    async def scenario() -> tuple[list[int], int, float]:
        run = JobRun(WorkerPool(1, 1), None, work)
        events = []
        while (event := await run.next()) is not ENDED:
            events.append(event)
        return events, await run.result(), run.queue_wait_s

    events, result, waited = asyncio.run(scenario())
    assert events == [0, 1, 2, 3, 4] and result == 42 and waited >= 0


def test_a_job_that_fails_before_any_event_ends_at_once_with_its_error() -> None:
    def work(_post, _cancel) -> int:
        raise ValueError("bad audio")

    async def scenario() -> None:
        run = JobRun(WorkerPool(1, 1), None, work)
        assert await run.next() is ENDED
        assert isinstance(run.error(), ValueError)
        with pytest.raises(ValueError, match="bad audio"):
            await run.result()

    asyncio.run(scenario())


def test_a_full_queue_refuses_the_run_when_it_is_started() -> None:
    release = threading.Event()

    async def scenario() -> None:
        pool = WorkerPool(1, 0)
        busy = JobRun(pool, None, lambda _post, _cancel: release.wait(10))
        with pytest.raises(QueueFullError):
            JobRun(pool, None, lambda _post, _cancel: None)
        release.set()
        assert await busy.result() is True

    asyncio.run(scenario())


def test_cancelling_stops_the_running_job_and_drops_the_waiting_one() -> None:
    started = threading.Event()

    def running(post, cancel: threading.Event) -> str:
        started.set()
        post("started")
        return "stopped" if cancel.wait(10) else "ran to the end"

    async def scenario() -> None:
        pool = WorkerPool(1, 1)
        first = JobRun(pool, None, running)
        waiting = JobRun(pool, None, lambda _post, _cancel: "ran")
        assert await first.next() == "started"
        waiter = asyncio.ensure_future(waiting.result())
        await asyncio.sleep(0)
        waiter.cancel()  # the awaiting task is cancelled: the waiting job is dropped
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert waiting.done  # dropped at once, on this thread
        first.cancel()
        # it saw the cancel and returned (its end is set on its worker thread: awaited, not
        # read right after the pool drained, which another callback there reports first)
        assert await asyncio.wait_for(first.result(), 5) == "stopped"
        await asyncio.wait_for(pool.drained(), 5)

    asyncio.run(scenario())


def test_a_finished_run_is_freed_by_its_last_reference_not_by_a_gc_pass() -> None:
    """Nothing the worker or the future keeps points back at the run: the run (and the lease it
    was given, and so the job's model) goes as soon as the route lets it go. A cycle through the
    future kept an unloaded model's memory until Python's next full collection."""

    submitted = threading.Event()  # the job ends after every callback is on its future

    async def scenario() -> weakref.ref:
        run = JobRun(WorkerPool(1, 1), None, lambda _post, _cancel: submitted.wait(5) and "done")
        submitted.set()
        assert await run.result() == "done"
        assert await run.next() is ENDED
        return weakref.ref(run)

    gc.disable()
    try:
        assert asyncio.run(scenario())() is None
    finally:
        gc.enable()


def test_a_cancelled_awaiter_leaves_the_end_of_handed_on_work_to_that_work() -> None:
    """The job handed its model work on (a future) and its awaiter is cancelled: the job is told
    to stop, and it ends (its place in the pool, and its lease, going back) only when that work
    ends, with that work's outcome."""
    handed: Future = Future()
    returned = threading.Event()
    told: list[threading.Event] = []

    def work(_post, cancel: threading.Event) -> Future:
        told.append(cancel)
        returned.set()
        return handed

    async def scenario() -> None:
        pool = WorkerPool(1, 0)
        run = JobRun(pool, None, work)
        waiter = asyncio.ensure_future(run.result())
        await asyncio.to_thread(returned.wait, 5)
        await asyncio.sleep(0.1)  # the worker thread is done: the work goes on elsewhere
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert told[0].is_set(), "the job was told to stop"
        assert not run.done and pool.stats().active == 1, "its work still runs"
        handed.set_exception(RuntimeError("stopped at its next step"))
        assert await run.next() is ENDED
        assert isinstance(run.error(), RuntimeError)
        assert pool.stats().active == 0

    asyncio.run(scenario())
