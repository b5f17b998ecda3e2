"""RealTimeFeed: audio reaches a live session no faster than it was spoken (plus a lead)."""

from __future__ import annotations

import asyncio

import pytest

from app.service.live.pacing import RealTimeFeed

BYTES_PER_S = 32000  # 16 kHz, 16-bit, mono


class Arrivals:
    """Records when each chunk reached the session (the feed's sink)."""

    def __init__(self, fail_after: int | None = None, expect: int = 0) -> None:
        self.times: list[float] = []
        self.fail_after = fail_after
        self.expect = expect
        self.all_in = asyncio.Event()

    def append(self, data: bytes) -> None:
        if self.fail_after is not None and len(self.times) >= self.fail_after:
            raise RuntimeError("limit")
        self.times.append(asyncio.get_running_loop().time())
        if len(self.times) == self.expect:
            self.all_in.set()


async def burst(chunks: int, lead_s: float) -> tuple[list[float], float]:
    arrivals = Arrivals(expect=chunks)
    feed = RealTimeFeed(arrivals.append, BYTES_PER_S, lead_s=lead_s)
    started = asyncio.get_running_loop().time()
    for _ in range(chunks):
        feed.put(b"\0" * (BYTES_PER_S // 10))  # 100 ms each, all at once
    await asyncio.wait_for(arrivals.all_in.wait(), 10)
    await feed.stop()
    return [t - started for t in arrivals.times], started


def test_a_burst_is_fed_at_real_time_pace() -> None:
    times, _ = asyncio.run(burst(10, lead_s=0.2))
    # chunk i (i * 100 ms of audio already fed) is due at i * 0.1 - 0.2 s
    for i, t in enumerate(times):
        assert t >= i * 0.1 - 0.2 - 0.01, (i, t)
    assert times[-1] == pytest.approx(0.7, abs=0.05)


def test_flush_hands_over_the_rest_and_errors_surface() -> None:
    async def go() -> tuple[int, BaseException | None]:
        arrivals = Arrivals(fail_after=3)
        feed = RealTimeFeed(arrivals.append, BYTES_PER_S, lead_s=0.0)
        for _ in range(5):
            feed.put(b"\0" * 3200)
        error = None
        try:
            feed.flush()
        except RuntimeError as e:
            error = e
        await feed.stop()
        return len(arrivals.times), error

    fed, error = asyncio.run(go())
    assert fed == 3 and isinstance(error, RuntimeError)
