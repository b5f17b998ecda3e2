"""Encoder calls and decoder steps on the same CPU take turns (no model needed).

The turns' clock is a counter that only the thread holding a turn advances (by the "work" it
does), so the order of turns is decided by the policy alone, not by this machine's speed."""

from __future__ import annotations

import threading
import time

import pytest

from app.service.batching.core_turns import CoreTurns

ENCODE_S, STEP_S = 1 / 64, 1 / 256  # exact in binary: no rounding in the clock


class WorkClock:
    """Seconds of simulated work done inside turns."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run_lanes(turns: CoreTurns, clock: WorkClock, encodes: int, steps: int) -> list[str]:
    """An encoder lane with `encodes` calls queued and a decoder lane stepping `steps` times, both
    asking for turns back to back; returns the order of turns ("E" / "D")."""
    order: list[str] = []
    holders: list[str] = []
    overlaps: list[str] = []

    def lane(kind: str, count: int, seconds: float) -> None:
        take = turns.encoder if kind == "E" else turns.decoder
        for _ in range(count):
            with take():
                holders.append(kind)
                if len(holders) > 1:
                    overlaps.append(kind)
                order.append(kind)
                clock.now += seconds
                time.sleep(0.0005)  # let the other lane queue up while this one holds the turn
                holders.pop()

    threads = [
        threading.Thread(target=lane, args=("D", steps, STEP_S)),
        threading.Thread(target=lane, args=("E", encodes, ENCODE_S)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not any(t.is_alive() for t in threads), "a lane never got its turns"
    assert not overlaps, "two model calls held the cores at once"
    return order


@pytest.mark.parametrize(("share", "expected_steps"), [(0.5, 4), (0.25, 12)])
def test_encoder_gets_its_share_while_decodes_run(share: float, expected_steps: int) -> None:
    """After an encoder call of E seconds the decoder lane gets E * (1 - share) / share seconds:
    a 15.6 ms encode, 3.9 ms steps -> 4 steps between encodes at share 0.5, 12 at 0.25. The
    encoder is not starved either: its next call comes as soon as that time has passed.
    idle_s is shorter than an encode: a decoder lane kept waiting by an encode is not idle."""
    clock = WorkClock()
    order = run_lanes(CoreTurns(share, idle_s=0.001, clock=clock), clock, encodes=5, steps=200)
    between = [len(run) for run in "".join(order).split("E")[1:-1]]
    assert order.count("E") == 5 and order.count("D") == 200
    assert between == [expected_steps] * 4, "".join(order)


def test_encoder_share_one_goes_whenever_the_cores_are_free() -> None:
    clock = WorkClock()
    order = run_lanes(CoreTurns(1.0, clock=clock), clock, encodes=5, steps=50)
    between = [len(run) for run in "".join(order).split("E")[1:-1]]
    assert all(n <= 1 for n in between), "".join(order)


def test_encoder_does_not_wait_for_an_idle_decoder() -> None:
    """With no decoder step asking, encoder calls follow each other without waiting for a
    share they would have to leave to nobody."""
    clock = WorkClock()
    turns = CoreTurns(0.1, idle_s=0.02, clock=clock)
    with turns.decoder():
        clock.now += STEP_S
    clock.now += 0.03  # the decoder lane has had nothing to do for 30 ms (idle_s: 20)
    done = threading.Event()

    def encodes() -> None:
        for _ in range(3):
            with turns.encoder():
                clock.now += ENCODE_S
        done.set()

    threading.Thread(target=encodes, daemon=True).start()
    assert done.wait(5), "encoder calls waited for an idle decoder lane"


def test_an_encoder_call_starts_at_once_when_the_decoder_lane_says_it_is_idle() -> None:
    """Right after a step the decoder lane may step again, so an encoder call whose share has
    not come waits; once the lane says it has no step to run (its only decode moved on to its
    next window's encoder call), the call starts without waiting `idle_s`."""
    clock = WorkClock()  # frozen from here on: only `decoder_idle` can let the call start
    turns = CoreTurns(0.5, idle_s=0.02, clock=clock)
    with turns.encoder():
        clock.now += ENCODE_S  # the next encoder call's share comes ENCODE_S later
    with turns.decoder():
        clock.now += STEP_S
    started = threading.Event()

    def encode() -> None:
        with turns.encoder():
            started.set()

    threading.Thread(target=encode, daemon=True).start()
    assert not started.wait(0.2), "the encoder call did not wait for a busy decoder lane"
    turns.decoder_idle()
    assert started.wait(5), "the encoder call waited for an idle decoder lane"


def test_calls_on_real_time_never_overlap() -> None:
    """The system clock and real work: still one call at a time, and both lanes finish."""
    turns = CoreTurns(0.5)
    inside = []
    overlaps = []

    def lane(take, count: int, seconds: float) -> None:
        for _ in range(count):
            with take():
                inside.append(1)
                if len(inside) > 1:
                    overlaps.append(1)
                time.sleep(seconds)
                inside.pop()

    threads = [
        threading.Thread(target=lane, args=(turns.decoder, 60, 0.002)),
        threading.Thread(target=lane, args=(turns.encoder, 4, 0.01)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not any(t.is_alive() for t in threads)
    assert not overlaps


def test_share_must_be_in_range() -> None:
    for share in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="encoder_share"):
            CoreTurns(share)
