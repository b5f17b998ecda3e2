"""Side threads (`app.engine.side_threads`): parts of a computation run beside the caller, and a
part no side thread has taken yet runs in the caller's thread instead of waiting in the queue."""

from __future__ import annotations

import threading

from app.engine.side_threads import SIDE_THREADS, beside


def _thread_name() -> str:
    return threading.current_thread().name


def test_a_part_runs_on_a_side_thread_when_one_is_free() -> None:
    started = threading.Event()

    def part() -> str:
        started.set()
        return _thread_name()

    join = beside(part)
    assert started.wait(10)
    assert join().startswith("side")


def test_a_part_waiting_behind_busy_side_threads_runs_in_the_callers_thread() -> None:
    release = threading.Event()
    running = threading.Semaphore(0)

    def busy() -> None:
        running.release()
        release.wait(10)

    blockers = [beside(busy) for _ in range(SIDE_THREADS)]
    for _ in range(SIDE_THREADS):
        assert running.acquire(timeout=10)  # every side thread is taken
    try:
        assert beside(_thread_name)() == threading.current_thread().name
    finally:
        release.set()
    for join in blockers:
        join()
