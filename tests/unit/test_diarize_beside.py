"""The speaker pass beside the transcription (`app.service.diarize.beside`): segments held until
the speaker turns are known, two calls at once that stop each other and surface their errors."""

from __future__ import annotations

import threading
import time

import pytest

from app.service.diarize.beside import HeldSegments, Stop, beside
from app.service.transcription.transcriber import TranscriptionCancelled


def _until_stopped(stop: threading.Event) -> None:
    """Work that polls `stop` as the transcription and the diarizer do."""
    for _ in range(20_000):
        if stop.is_set():
            raise TranscriptionCancelled("stopped")
        time.sleep(0.0005)
    raise AssertionError("never stopped")


def _no_thread_named(name: str) -> bool:
    return all(t.name != name for t in threading.enumerate())


def test_segments_before_the_release_are_held_then_sent_in_order() -> None:
    sent: list[str] = []
    held: HeldSegments[int, str] = HeldSegments(sent.append)
    held.add(1)
    held.add(2)
    assert sent == []
    held.release(lambda n: f"A{n}")
    assert sent == ["A1", "A2"]
    held.add(3)
    assert sent == ["A1", "A2", "A3"]
    with pytest.raises(RuntimeError, match="released already"):
        held.release(lambda n: f"B{n}")


def _release_while_adding(count: int) -> list[int]:
    """What goes out when one thread adds `count` segments while this one releases them."""
    sent: list[int] = []
    held: HeldSegments[int, int] = HeldSegments(sent.append)
    started = threading.Barrier(2)

    def add_all() -> None:
        started.wait()
        for n in range(count):
            held.add(n)

    adder = threading.Thread(target=add_all)
    adder.start()
    started.wait()
    held.release(lambda n: n)
    adder.join()
    return sent


def test_segments_added_while_another_thread_releases_go_out_once_each_in_order() -> None:
    for _ in range(50):
        assert _release_while_adding(300) == list(range(300))


def test_both_values_come_back_and_the_side_runs_on_its_own_thread() -> None:
    def side() -> str:
        return threading.current_thread().name

    main_value, side_thread = beside(lambda: 1, side, Stop(), name="side-1")
    assert (main_value, side_thread) == (1, "side-1")
    assert _no_thread_named("side-1")


def test_a_failing_side_stops_the_main_call_and_its_error_is_raised() -> None:
    stop = Stop()

    def side() -> None:
        raise ValueError("side broke")

    with pytest.raises(ValueError, match="side broke"):
        beside(lambda: _until_stopped(stop), side, stop, name="side-2")
    assert _no_thread_named("side-2")


def test_a_failing_main_call_stops_the_side_and_its_error_is_raised() -> None:
    stop = Stop()
    side_ended = threading.Event()

    def side() -> None:
        try:
            _until_stopped(stop)
        finally:
            side_ended.set()

    def main() -> None:
        raise KeyError("main broke")

    with pytest.raises(KeyError, match="main broke"):
        beside(main, side, stop, name="side-3")
    assert side_ended.is_set()
    assert _no_thread_named("side-3")


def test_the_side_fails_after_the_main_call_is_done_and_its_error_is_raised() -> None:
    def side() -> None:
        time.sleep(0.05)
        raise ValueError("late")

    with pytest.raises(ValueError, match="late"):
        beside(lambda: "done", side, Stop(), name="side-4")


def test_the_callers_cancel_stops_both_without_being_set_by_them() -> None:
    outer = threading.Event()
    stop = Stop(outer)

    def main() -> None:
        outer.set()
        _until_stopped(stop)

    with pytest.raises(TranscriptionCancelled):
        beside(main, lambda: _until_stopped(stop), stop, name="side-5")
    assert _no_thread_named("side-5")
    own = Stop(threading.Event())
    own.set()
    assert own.is_set() and not own._outer.is_set()
