"""Threads beside the caller's for numpy and ONNX Runtime work that splits into independent parts
(the log-mel's halves, the VAD's fronts): both release the GIL while they compute, so on two
cores a part runs on each.

One pool for the process: the parts of every request queue in it, and a part no side thread has
started yet when its caller wants it runs in the caller's thread instead (`beside`), so a caller
never waits behind other requests' parts: under load the work is done as it would be without
the pool.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

SIDE_THREADS = 2
_pool = ThreadPoolExecutor(SIDE_THREADS, thread_name_prefix="side")


def beside(fn: Callable[..., T], *args: object) -> Callable[[], T]:
    """Start `fn(*args)` on a side thread; returns the function that gives its result (computed
    now, in the calling thread, when no side thread has started it)."""
    future = _pool.submit(fn, *args)

    def join() -> T:
        return fn(*args) if future.cancel() else future.result()

    return join
