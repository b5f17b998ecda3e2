"""The batching scheduler's encoder lane: a thread that runs up to `max_encode` new 30 s windows
per encoder call and holds each single window's cross K/V in a slot of the slab (`cross_slab`),
so the decoder lane can group windows by slot without copying them. When the encoder and the
decoder share the CPU the lane takes its turns (`CoreTurns`)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from app.service.batching.core_turns import CoreTurns, FreeCores
from app.service.batching.cross_slab import CrossKV, CrossSlab
from app.service.batching.pack import EncodeCall, PendingCall
from app.service.batching.records import SchedulerClosedError, StepRecord

if TYPE_CHECKING:
    from app.runtime.sessions import WhisperSessions

log = logging.getLogger(__name__)

Finished = Callable[[StepRecord], None]  # after every encoder call: its record


def serve_calls(serve: Callable[[list], None], calls: list[PendingCall]) -> None:
    """serve(calls); if it fails, every call still waiting gets the error (never a hang)."""
    try:
        serve(calls)
    except BaseException as e:
        log.exception("batching scheduler failed")
        for call in calls:
            if not call.done.is_set():
                call.finish(error=e)


class EncoderLane:
    """Windows in, cross K/V out; `slab_rows`: the slab's slots (the decoder's rows plus the
    windows on their way)."""

    def __init__(
        self,
        inner: WhisperSessions,
        max_encode: int,
        slab_rows: int,
        turns: CoreTurns | FreeCores,
        finished: Finished,
        name: str,
    ) -> None:
        self._inner = inner
        self._max_encode = max_encode
        self._slab_rows = slab_rows
        self._turns = turns
        self._finished = finished
        self._cond = threading.Condition()
        self._calls: list[EncodeCall] = []
        self._closed = False
        self.slab: CrossSlab | None = None  # created at the first encode (shapes known then)
        self._thread = threading.Thread(target=self._loop, name=f"stt-encode-{name}", daemon=True)
        self._thread.start()

    def encode(self, features: np.ndarray) -> list[np.ndarray]:
        """features f32 [B, n_mels, 3000] -> cross K/V, each [B, H, 1500, Dh] (batched with
        other callers' windows)."""
        call = EncodeCall(threading.get_ident(), features.shape[0], features=features)
        with self._cond:
            if self._closed:
                raise SchedulerClosedError("the model scheduler is closed")
            self._calls.append(call)
            self._cond.notify_all()
        return call.outcome()  # type: ignore[return-value]

    def holds(self, cross: list[np.ndarray]) -> bool:
        """True when `cross` sits in this lane's slab."""
        return isinstance(cross, CrossKV) and cross.slab is self.slab

    def close(self, timeout: float) -> None:
        """Encode what is queued, then stop; later calls raise."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._calls and not self._closed:
                    self._cond.wait()
                if not self._calls:
                    return
                batch = self._calls[: self._max_encode]
                del self._calls[: self._max_encode]
            with self._turns.encoder():
                serve_calls(self._encode, batch)
            del batch

    def _encode(self, calls: list[EncodeCall]) -> None:
        started = time.perf_counter()
        try:
            slab, single = self.slab, all(c.rows == 1 for c in calls)
            windows = [c.features for c in calls]
            held = slab.write(windows, self._inner.encode_into) if slab and single else None
            if held is None:  # the first window sizes the slab; no slot free; several rows
                cross = self._inner.encode(
                    np.concatenate(windows) if len(windows) > 1 else windows[0]
                )
                starts = np.cumsum([0] + [c.rows for c in calls])[:-1]
                held = [
                    self._hold(cross, int(at), c.rows) for at, c in zip(starts, calls, strict=True)
                ]
        except Exception as e:
            if len(calls) == 1:
                calls[0].finish(error=e)
                return
            log.exception("batched encoder call failed; encoding its windows one by one")
            for call in calls:
                self._encode([call])
            return
        for call, cross_kv in zip(calls, held, strict=True):
            call.finish(cross_kv)
        windows = sum(c.rows for c in calls)
        waited = started - min(c.arrived for c in calls)
        seconds = time.perf_counter() - started
        self._finished(StepRecord("encode", windows, len(calls), 0.0, waited, seconds))

    def _hold(self, cross: list[np.ndarray], offset: int, rows: int) -> list[np.ndarray]:
        """A caller's rows of encoder outputs: a slab slot for a single window when one is free,
        else plain views of the outputs."""
        if rows == 1:
            if self.slab is None:
                self.slab = CrossSlab(cross, self._slab_rows)
            held = self.slab.store(cross, offset)
            if held is not None:
                return held
        return [c[offset : offset + rows] for c in cross]
