"""The speaker pass beside the transcription: two calls at once, and the segments that finish
before the speaker turns are known.

`beside(main, side, stop)` runs `side` on a thread of its own while `main` runs on the caller's;
either failing sets `stop`, which both poll, so one failing stops the other, and the call returns
only once both have ended. `HeldSegments` passes finished segments on, split by speaker, once the
split is known: the ones that came before are held, then passed on in the order they came.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Generic, TypeVar

from app.service.transcription.transcriber import TranscriptionCancelled

A = TypeVar("A")
B = TypeVar("B")
T = TypeVar("T")
R = TypeVar("R")


class Stop(threading.Event):
    """One call's own cancel event, which also reads as set while the caller's `outer` is: set
    it to stop this call's work without setting the caller's event. Only `is_set` reads `outer`
    (the work polls it; nothing waits on it)."""

    def __init__(self, outer: threading.Event | None = None) -> None:
        super().__init__()
        self._outer = outer

    def is_set(self) -> bool:
        return super().is_set() or (self._outer is not None and self._outer.is_set())


class HeldSegments(Generic[T, R]):
    """Segments (`add`) go to `emit` through `split` once `release(split)` says how to split
    them; those added before are held and go out first, in the order they came. `add` and
    `release` may be called from different threads: `emit` is called under a lock, so never
    twice at once, and every segment goes out once, in order."""

    def __init__(self, emit: Callable[[R], None]) -> None:
        self._emit = emit
        self._lock = threading.Lock()
        self._held: list[T] = []
        self._split: Callable[[T], R] | None = None

    def add(self, segment: T) -> None:
        with self._lock:
            if self._split is None:
                self._held.append(segment)
            else:
                self._emit(self._split(segment))

    def release(self, split: Callable[[T], R]) -> None:
        with self._lock:
            if self._split is not None:
                raise RuntimeError("the held segments were released already")
            self._split = split
            held, self._held = self._held, []
            for segment in held:
                self._emit(split(segment))


def beside(
    main: Callable[[], A], side: Callable[[], B], stop: threading.Event, name: str = "beside"
) -> tuple[A, B]:
    """`side()` on a thread named `name` while `main()` runs on this one; both values once both
    have ended. Either failing sets `stop` (both are to poll it and raise
    `TranscriptionCancelled` once it is set). The error raised is `main`'s, unless `main` only
    stopped (`TranscriptionCancelled`) because `side` failed otherwise: `side`'s then."""
    outcome: Future[B] = Future()

    def run_side() -> None:
        try:
            outcome.set_result(side())
        except BaseException as e:  # handed to the caller below
            outcome.set_exception(e)
            stop.set()

    thread = threading.Thread(target=run_side, name=name, daemon=True)
    thread.start()
    try:
        value = main()
    except TranscriptionCancelled:
        stop.set()
        thread.join()
        side_error = outcome.exception()
        if side_error is not None and not isinstance(side_error, TranscriptionCancelled):
            raise side_error from None  # what stopped `main`
        raise
    except BaseException:
        stop.set()
        thread.join()
        raise
    thread.join()
    return value, outcome.result()
