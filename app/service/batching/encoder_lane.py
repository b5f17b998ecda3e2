"""The batching scheduler's encoder lane: a thread that runs up to `max_encode` new 30 s windows
per encoder call and holds each single window's cross K/V in a slot of the slab (`cross_slab`),
so the decoder lane can group windows by slot without copying them; it runs the aligner's calls
too (one at a time: word timing's, a window's text against its audio). When the encoder and the
decoder share the CPU the lane takes its turns (`CoreTurns`). A call comes from a waiting caller
(`encode`) or from a task (`submit`: its continuation runs on this thread after the call)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from app.runtime.steps import AlignerInputs, EncoderInputs
from app.service.batching.core_turns import CoreTurns, FreeCores
from app.service.batching.cross_slab import CrossKV, CrossSlab
from app.service.batching.pack import AlignCall, EncodeCall, PendingCall
from app.service.batching.records import SchedulerClosedError, StepRecord

if TYPE_CHECKING:
    from app.runtime.sessions import WhisperSessions

log = logging.getLogger(__name__)

Finished = Callable[[StepRecord], None]  # after every encoder or aligner call: its record
Then = Callable[[object, BaseException | None], None]  # a task's continuation: (outputs, error)


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
        self._calls: list[EncodeCall | AlignCall] = []
        self._closed = False
        self.slab: CrossSlab | None = None  # created at the first encode (shapes known then)
        self.thread = threading.Thread(target=self._loop, name=f"stt-encode-{name}", daemon=True)
        self.thread.start()

    def encode(self, features: np.ndarray) -> list[np.ndarray]:
        """features f32 [B, n_mels, 3000] -> cross K/V, each [B, H, 1500, Dh] (batched with
        other callers' windows)."""
        call = EncodeCall(threading.get_ident(), features.shape[0], features=features)
        self._queue(call)
        return call.outcome()  # type: ignore[return-value]

    def submit(self, inputs: EncoderInputs | AlignerInputs, then: Then) -> None:
        """Serve a task's call; `then(outputs, error)` runs on this lane afterwards."""
        caller = threading.get_ident()
        if isinstance(inputs, EncoderInputs):
            call: EncodeCall | AlignCall = EncodeCall(
                caller, inputs.features.shape[0], features=inputs.features
            )
        else:
            call = AlignCall(caller, inputs.input_ids.shape[0], inputs=inputs)
        call.then = then
        self._queue(call)

    def _queue(self, call: EncodeCall | AlignCall) -> None:
        with self._cond:
            if self._closed:
                raise SchedulerClosedError("the model scheduler is closed")
            self._calls.append(call)
            self._cond.notify_all()

    def holds(self, cross: list[np.ndarray]) -> bool:
        """True when `cross` sits in this lane's slab."""
        return isinstance(cross, CrossKV) and cross.slab is self.slab

    def close(self, timeout: float) -> None:
        """Encode what is queued, then stop (on this lane itself: once it has returned); later
        calls raise."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if threading.current_thread() is not self.thread:
            self.thread.join(timeout)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._calls and not self._closed:
                    self._cond.wait()
                if not self._calls:
                    return
                batch = self._take_locked()
            with self._turns.encoder():
                if isinstance(batch[0], AlignCall):
                    serve_calls(self._align, batch)
                else:
                    serve_calls(self._encode, batch)
            _continue(batch)  # the tasks' continuations, out of the encoder's turn
            del batch  # the windows' cross K/V: their tasks hold them now

    def _take_locked(self) -> list:
        """The next aligner call alone, else up to `max_encode` windows in arrival order."""
        first = self._calls[0]
        if isinstance(first, AlignCall):
            return [self._calls.pop(0)]
        batch = [c for c in self._calls if isinstance(c, EncodeCall)][: self._max_encode]
        taken = {id(c) for c in batch}
        self._calls = [c for c in self._calls if id(c) not in taken]
        return batch

    def _align(self, calls: list[AlignCall]) -> None:
        (call,) = calls
        started = time.perf_counter()
        inputs = call.inputs
        try:
            outputs = self._inner.align(inputs.input_ids, inputs.target_ids, inputs.cross)
        except Exception as e:
            call.finish(error=e)
            return
        call.finish(outputs)
        waited, seconds = started - call.arrived, time.perf_counter() - started
        self._finished(StepRecord("align", call.rows, 1, 0.0, waited, seconds))

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


def _continue(calls: list[PendingCall]) -> None:
    """Run the continuation of each served call that has one (a task's)."""
    for call in calls:
        if call.then is not None:
            call.then(call.result, call.error)
