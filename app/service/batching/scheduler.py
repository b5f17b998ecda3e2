"""Continuous cross-request batching: one decoder call per step serves every active decode.

A decode is a resumable task (`app.runtime.steps.Steps`: a generator that yields its decoder
calls and is sent their outputs). `BatchingSessions` stands in for `WhisperSessions`: a caller's
`run_steps(task)` runs the task in the caller's thread up to its first decoder call, hands it to
the scheduler and waits for the result; `decode()` (a single call) is a one-call task; `encode()`
is a call to the encoder lane. The decoder lane loops, as vLLM's engine does:

1. `schedule()`: every task with a decoder call waiting (all active tasks have one: a task is
   advanced as soon as its call is served, so nobody is waited for) is packed (pure:
   `pack.pack_by_slot`, `pack.pack_groups`): one-token calls (T = 1, the steady state of every
   greedy or beam decode) into groups of at most `max_rows` rows with at most `max_padding` of
   their past slots padding; calls that feed several tokens (a prompt's prefill, the reference
   `none` cache) with calls of the same length;
2. one decoder call per group: past self K/V left-padded to the group's longest,
   `attention_mask` zero over the padding, each task's rows taken back (the inputs are
   assembled in arrays the lane keeps while its steps keep their shape);
3. `update_from_output()`: each task is sent its outputs and runs its Python part of the step
   (logit filters, search, streaming its tokens) up to its next decoder call, or ends (its
   caller wakes with the result or the error);
4. encoder: a second thread, the encoder lane (`encoder_lane.py`), runs up to `max_encode`
   new 30 s windows per encoder call. When both stages run on the CPU, the two lanes take turns
   on the cores (`CoreTurns`: at once they slow each other down several-fold), the encoder
   taking at most `encoder_share` of the time while decodes run; on other devices they run
   side by side.

Cross K/V: windows encoded here live in slots of a slab (`cross_slab.py`); single-row calls
are grouped by slot, so a group's cross K/V are one contiguous slice of it (a slot whose task is
away this step becomes a masked dummy row, not a copy); other calls (beams, windows from outside)
are stacked by copy, kept while the group's members stay. Packing and the calls: `pack.py`;
options and records: `records.py`.

Tasks join and leave between steps; no caller waits for another to finish, and no thread is
blocked per step. Results equal unbatched decoding up to float rounding: padded positions are
masked out of attention.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from app.runtime.steps import DecoderInputs, DecoderOutputs, Steps, serve_steps
from app.service.batching.core_turns import CoreTurns, FreeCores
from app.service.batching.encoder_lane import EncoderLane, serve_calls
from app.service.batching.pack import (
    DecodeCall,
    InputScratch,
    Layout,
    PendingCall,
    assemble,
    pack_by_slot,
    pack_groups,
    padding,
    stacked_cross,
)
from app.service.batching.records import (
    BatchingOptions,
    SchedulerClosedError,
    StepLog,
    StepRecord,
)

if TYPE_CHECKING:
    from pathlib import Path

    from app.runtime.contract import Manifest
    from app.runtime.sessions import WhisperSessions

log = logging.getLogger(__name__)
T = TypeVar("T")

IDLE_RELEASE_S = 1.0  # a decoder lane idle this long drops its kept arrays


@dataclass(eq=False)
class _Task:
    """A caller's resumable decode in the scheduler: its generator and its decoder call waiting
    to be served (`call`), and what its caller waits on (`ended`)."""

    steps: Steps
    call: DecodeCall
    ended: PendingCall  # finished with the task's result or error; its caller waits on it


def _same_cpu(devices: dict[str, str]) -> bool:
    """True when the encoder and the decoder both run on the CPU (their calls compete for it)."""
    return {d.split(".")[0] for d in devices.values()} == {"CPU"}


class BatchingSessions:
    """`WhisperSessions`' interface (`encode`, `decode`, `manifest`, ...) over a scheduler thread
    that batches the calls of every thread using it. `close()` stops the thread."""

    def __init__(
        self,
        sessions: WhisperSessions,
        options: BatchingOptions | None = None,
        *,
        name: str = "model",
    ) -> None:
        self.inner = sessions
        self.options = options or BatchingOptions()
        self._log = StepLog()
        self.stats = self._log.stats
        self._cond = threading.Condition()
        self._waiting: list[_Task] = []  # tasks with a decoder call to serve
        self._closed = False
        self.turns = (
            CoreTurns(self.options.encoder_share) if _same_cpu(sessions.devices) else FreeCores()
        )
        opts = self.options
        slab_rows = opts.max_rows + 2 * opts.max_encode
        self._encoder = EncoderLane(
            sessions, opts.max_encode, slab_rows, self.turns, self._log.log, name
        )
        self._lane = threading.Thread(
            target=self._decoder_lane, name=f"stt-decode-{name}", daemon=True
        )
        self._lane.start()

    # -- the engine's WhisperBackend -------------------------------------------------------------
    @property
    def manifest(self) -> Manifest:
        return self.inner.manifest

    @property
    def folder(self) -> Path:
        return self.inner.folder

    @property
    def devices(self) -> dict[str, str]:
        return self.inner.devices

    @property
    def arithmetic(self) -> dict[str, str]:
        return self.inner.arithmetic

    @property
    def kv_dtype(self) -> np.dtype:
        return self.inner.kv_dtype

    @property
    def ep(self) -> str:
        return self.inner.ep

    @property
    def providers(self) -> dict[str, str]:
        return self.inner.providers

    def empty_past(self, batch: int = 1) -> list[np.ndarray]:
        return self.inner.empty_past(batch)

    def encode(self, features: np.ndarray) -> list[np.ndarray]:
        """features f32 [B, n_mels, 3000] -> cross K/V, each [B, H, 1500, Dh] (batched with
        other callers' windows on the encoder lane)."""
        return self._encoder.encode(features)

    def decode(
        self,
        input_ids: np.ndarray,
        position_ids: np.ndarray,
        attention_mask: np.ndarray,
        past: list[np.ndarray],
        cross: list[np.ndarray],
        logits_at: np.ndarray | None = None,
    ) -> DecoderOutputs:
        """One decoder call of one caller (shapes as `WhisperSessions.decode`), served in the
        next step together with every other task's with the same T and `logits_at`."""
        inputs = DecoderInputs(input_ids, position_ids, attention_mask, past, cross, logits_at)
        return self.run_steps(_one_call(inputs))

    def run_steps(self, steps: Steps[T]) -> T:
        """Run a resumable decode to its first decoder call here, then let the scheduler serve
        it with every other task; wait for its result (or raise its error). Asked from the
        decoder lane itself (a task's step that needs a decode of its own), it is served there
        and then, unbatched: waiting for the lane would wait forever."""
        if threading.current_thread() is self._lane:
            return serve_steps(steps, self.inner.decode)
        try:
            inputs = next(steps)
        except StopIteration as done:
            return done.value
        caller = threading.get_ident()
        task = _Task(steps, self._call(inputs), PendingCall(caller, inputs.rows))
        with self._cond:
            self._check_open()
            self._waiting.append(task)
            self._cond.notify_all()
        return task.ended.outcome()  # type: ignore[return-value]

    def _call(self, inputs: DecoderInputs) -> DecodeCall:
        rows = inputs.rows
        if inputs.attention_mask.shape != (rows, inputs.past_len + inputs.new_tokens):
            raise ValueError(
                f"attention_mask must be [{rows}, {inputs.past_len + inputs.new_tokens}], "
                f"got {list(inputs.attention_mask.shape)}"
            )
        return DecodeCall.of(threading.get_ident(), inputs)

    def align(
        self, input_ids: np.ndarray, target_ids: np.ndarray, cross: list[np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray]:
        """The aligner, run directly (once per window when words are asked for; not batched)."""
        return self.inner.align(input_ids, target_ids, cross)

    # -- observers and lifetime ----------------------------------------------------------------
    def add_observer(self, observer: Callable[[StepRecord], None]) -> None:
        """`observer(record)` is called on a scheduler thread after every model call."""
        self._log.add_observer(observer)

    def close(self, timeout: float = 10.0) -> None:
        """Serve what is pending, then stop the scheduler threads; later calls raise."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._lane.join(timeout)
        self._encoder.close(timeout)

    # -- internals ---------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise SchedulerClosedError("the model scheduler is closed")

    def _decoder_lane(self) -> None:
        # stacked cross K/V per group membership: key -> (the members' cross lists, stacked)
        stacked: dict[tuple, tuple[list, list[np.ndarray]]] = {}
        scratch = InputScratch()
        while True:
            with self._cond:
                while not self._waiting and not self._closed:
                    if not self._cond.wait(IDLE_RELEASE_S):  # idle: hand the memory back
                        stacked.clear()
                        scratch.clear()
                if not self._waiting:
                    return  # closed and drained
                tasks, self._waiting = self._waiting, []
            with self.turns.decoder():
                serve_calls(
                    lambda calls: self._serve(calls, stacked, scratch), [t.call for t in tasks]
                )
            self._update_from_output(tasks)
            del tasks  # they hold windows' cross K/V: drop them now, not at the next step

    def _update_from_output(self, tasks: list[_Task]) -> None:
        """Send each task its call's outputs: it runs its Python part of the step up to its next
        decoder call (back in the queue) or to its end (its caller wakes)."""
        going = []
        for task in tasks:
            call = task.call
            try:
                if call.error is not None:
                    raise call.error
                inputs = task.steps.send(call.result)  # type: ignore[arg-type]
                task.call = self._call(inputs)
                going.append(task)
            except StopIteration as done:
                task.ended.finish(done.value)
            except BaseException as e:  # the call failed, or the task did (cancelled ...)
                task.steps.close()
                task.ended.finish(error=e)
        if going:
            with self._cond:
                self._waiting.extend(going)

    def _serve(self, calls: list[DecodeCall], stacked: dict, scratch: InputScratch) -> None:
        """One decoder-lane iteration: calls with the same number of new tokens T and the same
        `logits_at` are batched (T = 1: the steps; T > 1: prompts' prefills), each such
        shape on its own.
        stacked: this lane's stacked cross K/V, by group membership; scratch: its input arrays."""
        opts = self.options
        slab = self._encoder.slab
        if slab is not None:
            slab.compact()
        live_keys: set[tuple] = set()
        for shape in sorted({c.inputs.shape_key for c in calls}, key=repr):
            same_t = [c for c in calls if c.inputs.shape_key == shape]
            new_tokens = shape[0]
            slotted, others = [], []
            for call in same_t:
                in_slot = call.rows == 1 and self._encoder.holds(call.cross)
                (slotted if in_slot else others).append(call)
            for lo, layout in pack_by_slot(slotted, opts.max_rows, opts.max_padding):
                assert slab is not None
                self._decode_group(layout, slab.view(lo, lo + layout.rows), scratch)
            for layout in pack_groups(others, opts.max_rows, opts.max_padding):
                if len(layout.calls) == 1:
                    self._decode_alone(layout.calls[0])
                    continue
                key = tuple((id(c.cross), c.rows, new_tokens) for c in layout.calls)
                live_keys.add(key)
                self._decode_group(layout, stacked_cross(stacked, key, layout), scratch)
        # stacked copies and input arrays of groups that did not run this step are dropped
        for key in list(stacked):
            if key not in live_keys:
                del stacked[key]
        scratch.drop_unused()

    def _decode_alone(self, call: DecodeCall) -> None:
        started = time.perf_counter()
        try:
            result = self.inner.decode(*call.inputs.args())
        except Exception as e:
            call.finish(error=e)
            return
        call.finish(result)
        waited, seconds = started - call.arrived, time.perf_counter() - started
        self._log.log(StepRecord(call.kind, call.rows, 1, 0.0, waited, seconds), call.rows)

    def _decode_group(self, layout: Layout, cross: list[np.ndarray], scratch: InputScratch) -> None:
        """One decoder call for the calls of `layout` (all with the same T and `logits_at`);
        `cross` has layout.rows rows; the inputs are assembled in `scratch`'s arrays."""
        if len(layout.calls) == 1 and layout.rows == layout.calls[0].rows:
            self._decode_alone(layout.calls[0])
            return
        started = time.perf_counter()
        rows = layout.rows
        try:
            input_ids, position_ids, mask, past = assemble(layout, scratch)
            logits_at = layout.calls[0].inputs.logits_at
            logits, new = self.inner.decode(input_ids, position_ids, mask, past, cross, logits_at)
        except Exception:
            log.exception("batched decoder call failed; its %d calls run alone", len(layout.calls))
            for call in layout.calls:
                self._decode_alone(call)
            return
        for call, offset in zip(layout.calls, layout.offsets, strict=True):
            end = offset + call.rows
            call.finish((logits[offset:end], [n[offset:end] for n in new]))
        waited = started - min(c.arrived for c in layout.calls)
        seconds = time.perf_counter() - started
        kind = layout.calls[0].kind
        record = StepRecord(kind, rows, len(layout.calls), padding(layout), waited, seconds)
        self._log.log(record, sum(c.rows for c in layout.calls))


def _one_call(inputs: DecoderInputs) -> Steps[DecoderOutputs]:
    """A single decoder call as a task."""
    return (yield inputs)
