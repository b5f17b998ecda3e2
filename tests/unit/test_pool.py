"""WorkerPool: bounded concurrency, bounded queue, gauges, cancellation; no model needed."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Future

import pytest

from app.service.pool import PoolClosedError, QueueFullError, WorkerPool

pytestmark = pytest.mark.timeout(30)


def blocker(gate: threading.Event, started: threading.Event | None = None):
    def job() -> str:
        if started is not None:
            started.set()
        assert gate.wait(10)
        return "done"

    return job


def test_capacity_is_workers_plus_queue() -> None:
    pool = WorkerPool(workers=2, max_queue=1)
    gate = threading.Event()
    try:
        futures = [pool.submit(blocker(gate)) for _ in range(3)]
        deadline = time.monotonic() + 5
        while pool.active < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pool.stats().active == 2 and pool.stats().queued == 1
        with pytest.raises(QueueFullError) as info:
            pool.submit(blocker(gate))
        assert info.value.retry_after_s >= 1
        gate.set()
        assert [f.result(5) for f in futures] == ["done"] * 3
        deadline = time.monotonic() + 5
        while (pool.active or pool.queued) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pool.stats().active == 0 and pool.stats().queued == 0
        assert pool.submit(lambda: 1).result(5) == 1  # room again
    finally:
        gate.set()
        pool.shutdown()


def test_zero_queue_rejects_second_job() -> None:
    pool = WorkerPool(workers=1, max_queue=0)
    gate, started = threading.Event(), threading.Event()
    try:
        first = pool.submit(blocker(gate, started))
        assert started.wait(5)
        with pytest.raises(QueueFullError):
            pool.submit(lambda: None)
        gate.set()
        assert first.result(5) == "done"
    finally:
        gate.set()
        pool.shutdown()


def test_job_errors_propagate_and_free_the_slot() -> None:
    pool = WorkerPool(workers=1, max_queue=0)
    try:

        def boom() -> None:
            raise ValueError("bad audio")

        with pytest.raises(ValueError, match="bad audio"):
            pool.submit(boom).result(5)
        time.sleep(0.05)
        assert pool.submit(lambda: 2).result(5) == 2
    finally:
        pool.shutdown()


def test_shutdown_refuses_new_jobs() -> None:
    pool = WorkerPool(workers=1, max_queue=0)
    pool.shutdown()
    with pytest.raises(PoolClosedError):
        pool.submit(lambda: None)


@pytest.mark.parametrize(("workers", "queue"), [(0, 1), (1, -1)])
def test_bad_sizes(workers: int, queue: int) -> None:
    with pytest.raises(ValueError):
        WorkerPool(workers, queue)


def test_room_wakes_a_waiter_when_a_job_finishes() -> None:
    """A caller refused with QueueFullError awaits `room()` (no polling) and gets in as soon as
    a running job finishes."""

    async def scenario() -> str:
        pool = WorkerPool(workers=1, max_queue=0)
        gate = threading.Event()
        try:
            first = asyncio.ensure_future(asyncio.wrap_future(pool.submit(blocker(gate))))
            await asyncio.sleep(0)
            with pytest.raises(QueueFullError):
                pool.submit(lambda: "second")
            room = asyncio.ensure_future(pool.room())
            await asyncio.sleep(0.05)
            assert not room.done(), "no job finished yet"
            gate.set()
            await asyncio.wait_for(room, 5)
            await first
            return await asyncio.wrap_future(pool.submit(lambda: "second"))
        finally:
            pool.shutdown()

    assert asyncio.run(scenario()) == "second"


def test_room_returns_at_once_when_the_refusing_job_finished_before_the_wait() -> None:
    """A refusal, then the only running job finishes before the caller awaits `room()`: no
    job will finish again, so `room()` must see the free slot instead of waiting for one."""

    async def scenario() -> None:
        pool = WorkerPool(workers=1, max_queue=0)
        gate = threading.Event()
        try:
            first = asyncio.ensure_future(asyncio.wrap_future(pool.submit(blocker(gate))))
            await asyncio.sleep(0)
            with pytest.raises(QueueFullError):
                pool.submit(lambda: "second")
            gate.set()
            await first
            await asyncio.wait_for(pool.room(), 5)
        finally:
            pool.shutdown()

    asyncio.run(scenario())


def test_drained_returns_once_running_and_waiting_jobs_are_done() -> None:
    async def scenario() -> None:
        pool = WorkerPool(workers=1, max_queue=1)
        first_gate, second_gate = threading.Event(), threading.Event()
        try:
            await asyncio.wait_for(pool.drained(), 1)  # nothing to wait for
            first = asyncio.ensure_future(asyncio.wrap_future(pool.submit(blocker(first_gate))))
            second = asyncio.ensure_future(asyncio.wrap_future(pool.submit(blocker(second_gate))))
            await asyncio.sleep(0)
            drained = asyncio.ensure_future(pool.drained())
            first_gate.set()
            await first
            await asyncio.sleep(0.05)  # drained() wakes on that finish, and waits on
            assert not drained.done(), "the second job is still running"
            second_gate.set()
            await asyncio.wait_for(drained, 5)
            assert pool.stats().active == pool.stats().queued == 0
            await second
        finally:
            pool.shutdown()

    asyncio.run(scenario())


def test_the_idle_hook_runs_when_the_last_running_or_waiting_job_is_done() -> None:
    """The server gives its free heap back when no job is left: not between two jobs of a
    queue, not while another job runs."""
    idle = threading.Event()
    calls: list[int] = []

    def on_idle() -> None:
        calls.append(pool.stats().active + pool.stats().queued)
        idle.set()

    pool = WorkerPool(workers=1, max_queue=1, on_idle=on_idle)
    first_gate, second_gate, second_started = (
        threading.Event(),
        threading.Event(),
        threading.Event(),
    )
    try:
        first = pool.submit(blocker(first_gate))
        second = pool.submit(blocker(second_gate, second_started))
        first_gate.set()
        assert first.result(5) == "done" and second_started.wait(5)
        assert not idle.wait(0.1), "the hook ran while a job was still running"
        second_gate.set()
        assert second.result(5) == "done"
        assert idle.wait(5)
        assert calls == [0]
    finally:
        first_gate.set()
        second_gate.set()
        pool.shutdown()


def test_with_a_delay_the_idle_hook_waits_until_no_job_has_come_for_that_long() -> None:
    """A job that comes within the delay keeps the heap (requests that follow each other reuse
    it); the hook runs once, a delay after the last job. Job 2 comes at once after job 1 and
    runs ~1.5 s: had job 1's wait not been called off, the hook would run at ~2 s, while the
    check below watches ~1.5-2.6 s; job 2's own wait ends at ~3.5 s."""
    idle = threading.Event()
    calls: list[int] = []

    def on_idle() -> None:
        calls.append(pool.stats().active + pool.stats().queued)
        idle.set()

    pool = WorkerPool(workers=1, max_queue=1, on_idle=on_idle, idle_delay_s=2.0)
    gate = threading.Event()
    try:
        assert pool.submit(lambda: "first").result(5) == "first"
        second = pool.submit(blocker(gate))
        time.sleep(1.5)
        gate.set()
        assert second.result(5) == "done"
        assert not idle.wait(1.1), "the hook ran within the delay after the last job"
        assert idle.wait(5), "the hook never ran"
        time.sleep(0.2)
        assert calls == [0]
    finally:
        gate.set()
        pool.shutdown()


def test_a_job_that_hands_its_work_on_frees_its_thread_and_keeps_its_place() -> None:
    """A job whose function returns a future (its model work goes on elsewhere) frees its
    thread at once but runs, in its place among the `workers`, until that work ends: with two
    workers on one thread the next job runs meanwhile; with one worker it waits."""
    handed: Future = Future()
    pool = WorkerPool(workers=2, max_queue=0, threads=1)
    try:
        first = pool.submit(lambda: handed)
        assert pool.submit(lambda: "beside").result(5) == "beside", "the thread was free"
        assert not first.done() or first.result() is handed
        assert pool.stats().active == 1, "the handed-on job still runs"
    finally:
        handed.set_result("done")
        pool.shutdown()

    handed = Future()
    pool = WorkerPool(workers=1, max_queue=1, threads=1)
    try:
        pool.submit(lambda: handed)
        waiting = pool.submit(lambda: "next")
        time.sleep(0.2)
        assert not waiting.done() and (pool.stats().active, pool.stats().queued) == (1, 1)
        handed.set_result("done")
        assert waiting.result(5) == "next"
    finally:
        pool.shutdown()
