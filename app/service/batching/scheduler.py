"""Continuous cross-request batching: one decoder call per step serves every active decode.

Model work is a resumable task (`app.runtime.steps.Steps`: a generator that yields its model
calls, encoder, decoder or aligner, and is sent their outputs): a whole transcription, a live
pass, one window's decode. `BatchingSessions` stands in for `WhisperSessions`: `start(task)` runs
the task in the caller's thread up to its first model call and returns its future; from then on
no thread waits for it: each call goes to its lane (`_resume`: decoder calls to the decoder
lane, encoder and aligner calls to the encoder lane), and the task's Python up to its next call
runs on the lane that served the last one. `run_steps(task)` is `start` and a wait; `decode()`
(a single call) is a one-call task; `encode()` is a call to the encoder lane. The decoder lane
loops, as vLLM's engine does:

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
   (logit filters, search, streaming its tokens) up to its next model call, or ends (its
   future gets the result or the error);
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
from concurrent.futures import Future
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
    """A resumable task in the scheduler: its generator, its decoder call waiting to be served
    (`call`; None while its call is on the encoder lane) and its result (`ended`)."""

    steps: Steps
    ended: Future
    call: DecodeCall | None = None


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
    def static(self) -> bool:
        return self.inner.static

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
        """`start(steps)` and wait for its result (or raise its error). Asked from a lane itself
        (a task's step that needs a model call of its own), it is served there and then,
        unbatched: waiting for the lane would wait forever."""
        if threading.current_thread() in (self._lane, self._encoder.thread):
            return serve_steps(steps, self.inner)
        return self.start(steps).result()

    def start(self, steps: Steps[T]) -> Future[T]:
        """Run a task here up to its first model call, then let the lanes serve it with every
        other task (its Python runs on the lane that served its last call); no thread waits for
        it. The future ends with its result or its error."""
        task = _Task(steps, Future())
        task.ended.set_running_or_notify_cancel()
        self._resume(task, None, None, started=False)
        return task.ended

    def _resume(
        self, task: _Task, outputs: object, error: BaseException | None, *, started: bool = True
    ) -> None:
        """Send a task its call's outputs (or start it) and route its next call to its lane;
        or end it with its result, or its error (a failed call's, or its own)."""
        try:
            if error is not None:
                raise error
            call = task.steps.send(outputs) if started else next(task.steps)
            if isinstance(call, DecoderInputs):
                task.call = self._call(call)
                with self._cond:
                    self._check_open()
                    self._waiting.append(task)
                    self._cond.notify_all()
            else:
                self._encoder.submit(call, lambda out, err: self._resume(task, out, err))
        except StopIteration as done:
            task.ended.set_result(done.value)
        except BaseException as e:  # the call failed, or the task did (cancelled ...)
            task.steps.close()
            task.ended.set_exception(e)

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
        """Serve what is pending, then stop the scheduler threads; later calls raise. Called on
        a lane (a task's end released the model's last lease there), that lane stops once it
        has returned."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if threading.current_thread() is not self._lane:
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
                if not self._waiting:  # no step to run: an encoder call need not wait for one
                    self.turns.decoder_idle()  # (its lock is never held while taking this one)
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
        model call (back in a queue) or to its end (its future is set)."""
        for task in tasks:
            call, task.call = task.call, None
            assert call is not None
            self._resume(task, call.result, call.error)

    def _serve(self, calls: list[DecodeCall], stacked: dict, scratch: InputScratch) -> None:
        """One decoder-lane iteration: calls with the same number of new tokens T and the same
        `logits_at` are batched (T = 1: the steps; T > 1: prompts' prefills), each such
        shape on its own.
        stacked: this lane's stacked cross K/V, by group membership; scratch: its input arrays."""
        if len(calls) == 1:  # a lone call runs as it is (packing would give it alone too)
            self._decode_alone(calls[0])
            stacked.clear()
            scratch.drop_unused()
            return
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
