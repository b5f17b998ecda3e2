"""Turns on the CPU cores for a model's encoder calls and decoder steps.

The batching scheduler runs encoder calls on one thread and decoder steps on another. When both
stages run on the same CPU, each OpenVINO call uses every core, and two calls at once slow each
other down by far more than running them one after the other costs (measured on 2 cores, tiny.en,
8 concurrent 60 s requests: an encoder window 167 -> ~600 ms, a 5-row decoder step ~10 -> 48 ms).
`CoreTurns` makes them take turns, and keeps a queue of encoder calls from starving the running
decodes: while decodes are running, the encoder lane gets at most `encoder_share` of the time.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable, Iterator


class CoreTurns:
    """One model call at a time; decoder steps and encoder calls alternate by time share.

    encoder_share: largest share of wall time, in (0, 1], that encoder calls take while decoder
        steps keep coming: after an encoder call of E seconds, the next one may start
        E * (1 - share) / share seconds later (1 = whenever the cores are free).
    idle_s: the decoder lane counts as idle when it is not waiting for a turn and has not had
        one for this long, or from when it says it has no step to run (`decoder_idle`); an
        encoder call then does not wait for its share.
    """

    def __init__(
        self,
        encoder_share: float = 0.5,
        idle_s: float = 0.02,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if not 0.0 < encoder_share <= 1.0:
            raise ValueError(f"encoder_share must be in (0, 1], got {encoder_share}")
        self.encoder_share = encoder_share
        self.idle_s = idle_s
        self._clock = clock
        self._gap_per_second = (1.0 - encoder_share) / encoder_share
        self._cond = threading.Condition()
        self._busy = False
        self._encoders_waiting = 0
        self._decoders_waiting = 0
        self._encoder_from = -math.inf  # earliest start of the next encoder call
        self._decoder_end = -math.inf  # end of the last decoder turn

    def _encoder_may_start(self, now: float) -> bool:
        decoder_idle = not self._decoders_waiting and now - self._decoder_end >= self.idle_s
        return now >= self._encoder_from or decoder_idle

    def _until_may_start(self, now: float) -> float:
        """Seconds until an encoder call may start, the cores being free but its turn not come;
        a waiting decoder step is woken first and notifies when it is done."""
        due = self._encoder_from
        if not self._decoders_waiting:
            due = min(due, self._decoder_end + self.idle_s)
        return max(due - now, 0.0)

    @contextlib.contextmanager
    def encoder(self) -> Iterator[None]:
        """Hold the cores for one encoder call."""
        with self._cond:
            self._encoders_waiting += 1
            try:
                while True:
                    now = self._clock()
                    if not self._busy and self._encoder_may_start(now):
                        break
                    self._cond.wait(None if self._busy else self._until_may_start(now))
                self._busy = True
            finally:
                self._encoders_waiting -= 1
        started = self._clock()
        try:
            yield
        finally:
            with self._cond:
                ended = self._clock()
                self._encoder_from = ended + (ended - started) * self._gap_per_second
                self._busy = False
                self._cond.notify_all()

    def decoder_idle(self) -> None:
        """The decoder lane has no step to run (every task is away or done): an encoder call
        may start now, without waiting `idle_s` for steps that are not coming."""
        with self._cond:
            self._decoder_end = -math.inf
            self._cond.notify_all()

    @contextlib.contextmanager
    def decoder(self) -> Iterator[None]:
        """Hold the cores for one decoder step; yields to an encoder call whose turn it is."""
        with self._cond:
            self._decoders_waiting += 1
            try:
                while self._busy or (
                    self._encoders_waiting and self._encoder_may_start(self._clock())
                ):
                    self._cond.wait(0.05)
                self._busy = True
            finally:
                self._decoders_waiting -= 1
        try:
            yield
        finally:
            with self._cond:
                self._decoder_end = self._clock()
                self._busy = False
                self._cond.notify_all()


class FreeCores:
    """No turns: the encoder and the decoder run on different devices (or cores)."""

    @contextlib.contextmanager
    def encoder(self) -> Iterator[None]:
        yield

    @contextlib.contextmanager
    def decoder(self) -> Iterator[None]:
        yield

    def decoder_idle(self) -> None:
        pass
