"""Continuous cross-request batching: one decoder call per step serves every active sequence.

Every request (REST job or live stream) keeps running its own decode loop on its own worker
thread, unchanged: `BatchingSessions` stands in for `WhisperSessions`, and each `decode()` /
`encode()` becomes a call handed to the model's scheduler, whose threads (a decoder lane and an
encoder lane) are the only ones that run the model. The decoder lane loops:

1. gather: wait until every caller served by the previous step has its next call in (at most
   `wait_ms`; a caller that ended its decode, was cancelled or is busy elsewhere is not waited for
   again; one that went on to encode its next window is not waited for at all), plus whatever
   else arrived meanwhile;
2. decode step: one-token calls (T = 1, the steady state of every greedy or beam decode) are
   packed into groups of at most `max_rows` rows with at most `max_padding` of their past slots
   padding; each group is ONE decoder call: past self K/V left-padded to the group's longest,
   `attention_mask` zero over the padding, and each caller gets its rows back (the inputs are
   assembled in arrays the lane keeps while its steps keep their shape);
3. calls that feed several tokens (a prompt's prefill, the reference `none`
   cache) are batched the same way with calls of the same length;
   `lanes` > 1 decoder-lane threads take turns: while one lane's call runs, the sequences it is
   not serving do their Python part of the step (logit filters, search) and gather in another
   lane (measured on 2 cores: no gain over one lane, so the default is 1);
4. encoder: a second thread, the encoder lane, runs up to `max_encode` new 30 s windows per
   encoder call. When both stages run on the CPU, the two lanes take turns on the cores
   (`CoreTurns`: at once they slow each other down several-fold), the encoder taking at most
   `encoder_share` of the time while decodes run; on other devices they run side by side.

Cross K/V cost: a decoder row reads its window's cross K/V ([H, 1500, Dh] per layer, 18 MB for tiny,
37 MB for base in f32) as much as the weights, so they are never copied per step. Windows encoded
here live in a *slab* of slots ([slots, H, 1500, Dh] per layer): the encoder writes a single window
straight into a free slot (the first window, which sizes the slab, is copied in; with no slot free,
or for a call of several rows, the caller keeps the encoder's own arrays). The caller gets views of
its slot (`CrossKV`, released when the caller drops it). Single-row calls are grouped by slot, so a
group's cross K/V are one contiguous slice of the slab; a slot in the middle whose caller is away
this step becomes a dummy row (masked, output dropped) rather than a copy, and live windows are
moved down into freed slots between steps; a freed slot's memory pages go back to the system
(`cross_slab.py`). Other calls (beams: several rows on one window; windows from outside) are stacked
by copy, and the copy is kept while the group's members stay the same.
Packing and the queued calls: `batch_pack.py`; options and records: `batch_records.py`.

Sequences join and leave between steps; no caller waits for another to finish. Results equal
unbatched decoding up to float rounding: padded positions are masked out of attention.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from app.service.batch_pack import (
    DecodeCall,
    DecoderInputs,
    EncodeCall,
    InputScratch,
    Layout,
    pack_by_slot,
    pack_groups,
    padding,
    stacked_cross,
)
from app.service.batch_records import (
    BatchingOptions,
    BatchingStats,
    SchedulerClosedError,
    StepRecord,
)
from app.service.core_turns import CoreTurns, FreeCores
from app.service.cross_slab import CrossKV, CrossSlab

if TYPE_CHECKING:
    from pathlib import Path

    from app.runtime.contract import Manifest
    from app.runtime.sessions import WhisperSessions

log = logging.getLogger(__name__)


IDLE_RELEASE_S = 1.0  # a decoder lane idle this long drops its kept arrays


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
        self.stats = BatchingStats()
        self._observers: list[Callable[[StepRecord], None]] = []
        self._cond = threading.Condition()
        self._pending: list[DecodeCall] = []
        self._encodes: list[EncodeCall] = []
        self._closed = False
        self._last_callers: set[int] = set()  # served by the last two decoder-lane iterations
        self._previous_callers: set[int] = set()
        self._in_flight: set[int] = set()  # callers whose calls a lane is serving now
        self._stats_lock = threading.Lock()
        self._slab: CrossSlab | None = None  # created at the first encode (shapes known then)
        self.turns = (
            CoreTurns(self.options.encoder_share) if _same_cpu(sessions.devices) else FreeCores()
        )
        self._threads = [
            threading.Thread(target=self._decoder_lane, name=f"stt-decode{i}-{name}", daemon=True)
            for i in range(self.options.lanes)
        ]
        self._threads.append(
            threading.Thread(target=self._encoder_lane, name=f"stt-encode-{name}", daemon=True)
        )
        for thread in self._threads:
            thread.start()

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
        other callers' windows)."""
        call = EncodeCall(threading.get_ident(), features.shape[0], features=features)
        with self._cond:
            self._check_open()
            self._encodes.append(call)
            # busy encoding: no step waits for it
            self._last_callers.discard(call.caller)
            self._previous_callers.discard(call.caller)
            self._cond.notify_all()
        return call.outcome()  # type: ignore[return-value]

    def decode(
        self,
        input_ids: np.ndarray,
        position_ids: np.ndarray,
        attention_mask: np.ndarray,
        past: list[np.ndarray],
        cross: list[np.ndarray],
        logits_at: np.ndarray | None = None,
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """One decoder call of one caller (shapes as `WhisperSessions.decode`), served in the
        next step together with every other caller's with the same T and `logits_at`."""
        rows = input_ids.shape[0]
        p = past[0].shape[2]
        if attention_mask.shape != (rows, p + input_ids.shape[1]):
            raise ValueError(
                f"attention_mask must be [{rows}, {p + input_ids.shape[1]}], "
                f"got {list(attention_mask.shape)}"
            )
        inputs = DecoderInputs(input_ids, position_ids, attention_mask, past, cross, logits_at)
        call = DecodeCall.of(threading.get_ident(), inputs)
        with self._cond:
            self._check_open()
            self._pending.append(call)
            self._cond.notify_all()
        return call.outcome()  # type: ignore[return-value]

    def align(
        self, input_ids: np.ndarray, target_ids: np.ndarray, cross: list[np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray]:
        """The aligner, run directly (once per window when words are asked for; not batched)."""
        return self.inner.align(input_ids, target_ids, cross)

    # -- observers and lifetime ----------------------------------------------------------------
    def add_observer(self, observer: Callable[[StepRecord], None]) -> None:
        """`observer(record)` is called on a scheduler thread after every model call."""
        self._observers.append(observer)

    def close(self, timeout: float = 10.0) -> None:
        """Serve what is pending, then stop the scheduler threads; later calls raise."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(timeout)

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
                while not self._pending and not self._closed:
                    if not self._cond.wait(IDLE_RELEASE_S):  # idle: hand the memory back
                        stacked.clear()
                        scratch.clear()
                if not self._pending:
                    return  # closed and drained
                self._gather_locked()
                calls, self._pending = self._pending, []
                callers = {c.caller for c in calls}
                self._in_flight |= callers
            with self.turns.decoder():
                self._run(lambda batch: self._serve(batch, stacked, scratch), calls)
            with self._cond:
                self._in_flight -= callers
            del calls  # they hold windows' cross K/V: drop them now, not at the next step

    def _encoder_lane(self) -> None:
        while True:
            with self._cond:
                while not self._encodes and not self._closed:
                    self._cond.wait()
                if not self._encodes:
                    return
                batch = self._encodes[: self.options.max_encode]
                del self._encodes[: self.options.max_encode]
            with self.turns.encoder():
                self._run(self._encode, batch)
            del batch

    def _run(self, serve: Callable[[list], None], calls: list) -> None:
        """serve(calls); if it fails, every call still waiting gets the error (never a hang)."""
        try:
            serve(calls)
        except BaseException as e:
            log.exception("batching scheduler failed")
            for call in calls:
                if not call.done.is_set():
                    call.finish(error=e)

    def _gather_locked(self) -> None:
        """Wait (lock held, released while waiting) at most `wait_ms` for the callers of the last
        two steps to be back. Two, not one: two callers that fell out of step (each served alone,
        in turn) are waited for and merge again."""
        deadline = time.perf_counter() + self.options.wait_ms / 1000
        while not self._closed:
            missing = self._last_callers - self._in_flight - {c.caller for c in self._pending}
            remaining = deadline - time.perf_counter()
            if not missing or remaining <= 0:
                return
            self._cond.wait(remaining)

    def _serve(self, calls: list[DecodeCall], stacked: dict, scratch: InputScratch) -> None:
        """One decoder-lane iteration: calls with the same number of new tokens T and the same
        `logits_at` are batched (T = 1: the steps; T > 1: prompts' prefills), each such
        shape on its own.
        stacked: this lane's stacked cross K/V, by group membership; scratch: its input arrays."""
        with self._cond:
            served = {c.caller for c in calls}
            self._last_callers = served | self._previous_callers
            self._previous_callers = served
        opts = self.options
        if self._slab is not None:
            self._slab.compact()
        live_keys: set[tuple] = set()
        for shape in sorted({c.inputs.shape_key for c in calls}, key=repr):
            same_t = [c for c in calls if c.inputs.shape_key == shape]
            new_tokens = shape[0]
            slotted, others = [], []
            for call in same_t:
                in_slot = call.rows == 1 and self._in_slab(call.cross)
                (slotted if in_slot else others).append(call)
            for lo, layout in pack_by_slot(slotted, opts.max_rows, opts.max_padding):
                assert self._slab is not None
                self._decode_group(layout, self._slab.view(lo, lo + layout.rows), scratch)
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

    def _in_slab(self, cross: list[np.ndarray]) -> bool:
        return isinstance(cross, CrossKV) and cross.slab is self._slab

    def _record(self, record: StepRecord) -> None:
        for observer in self._observers:
            try:
                observer(record)
            except Exception:  # a metrics hiccup must not fail a decode
                log.exception("batching observer failed")

    def _decode_alone(self, call: DecodeCall) -> None:
        started = time.perf_counter()
        try:
            result = self.inner.decode(*call.inputs.args())
        except Exception as e:
            call.finish(error=e)
            return
        call.finish(result)
        waited, seconds = started - call.arrived, time.perf_counter() - started
        self._count(call.new_tokens, call.rows)
        self._record(StepRecord(call.kind, call.rows, 1, 0.0, waited, seconds))

    def _decode_group(self, layout: Layout, cross: list[np.ndarray], scratch: InputScratch) -> None:
        """One decoder call for the calls of `layout` (all with the same T and `logits_at`);
        `cross` has layout.rows rows; the inputs are assembled in `scratch`'s arrays."""
        if len(layout.calls) == 1 and layout.rows == layout.calls[0].rows:
            self._decode_alone(layout.calls[0])
            return
        started = time.perf_counter()
        rows = layout.rows
        new_tokens = layout.calls[0].new_tokens
        longest = max(c.past_len for c in layout.calls)
        try:
            input_ids, position_ids, mask, past = scratch.take(
                rows, new_tokens, longest, layout.calls[0].inputs.past
            )
            input_ids[:] = 0  # dummy rows: token 0, position 0
            position_ids[:] = 0
            mask[:] = 0  # [R, P + T], 0 = padding
            mask[:, longest:] = 1  # a dummy row attends to its own tokens only
            for call, offset in zip(layout.calls, layout.offsets, strict=True):
                rows_of = slice(offset, offset + call.rows)
                pad = longest - call.past_len
                input_ids[rows_of] = call.inputs.input_ids
                position_ids[rows_of] = call.inputs.position_ids
                mask[rows_of, pad:] = call.inputs.attention_mask
                for dst, src in zip(past, call.inputs.past, strict=True):
                    dst[rows_of, :, :pad] = 0
                    dst[rows_of, :, pad:] = src
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
        self._count(new_tokens, sum(c.rows for c in layout.calls))
        waited = started - min(c.arrived for c in layout.calls)
        seconds = time.perf_counter() - started
        kind = layout.calls[0].kind
        record = StepRecord(kind, rows, len(layout.calls), padding(layout), waited, seconds)
        self._record(record)

    def _count(self, new_tokens: int, rows: int) -> None:
        with self._stats_lock:
            if new_tokens == 1:
                self.stats.decode_steps += 1
                self.stats.decode_rows += rows
            else:
                self.stats.prefill_calls += 1

    def _encode(self, calls: list[EncodeCall]) -> None:
        started = time.perf_counter()
        try:
            slab, single = self._slab, all(c.rows == 1 for c in calls)
            windows = [c.features for c in calls]
            held = slab.write(windows, self.inner.encode_into) if slab and single else None
            if held is None:  # the first window sizes the slab; no slot free; several rows
                cross = self.inner.encode(
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
        with self._stats_lock:
            self.stats.encode_calls += 1
            self.stats.encode_windows += windows
        waited = started - min(c.arrived for c in calls)
        seconds = time.perf_counter() - started
        self._record(StepRecord("encode", windows, len(calls), 0.0, waited, seconds))

    def _hold(self, cross: list[np.ndarray], offset: int, rows: int) -> list[np.ndarray]:
        """A caller's rows of encoder outputs: a slab slot for a single window when one is free,
        else plain views of the outputs."""
        if rows == 1:
            if self._slab is None:
                self._slab = CrossSlab(cross, self.options.max_rows + 2 * self.options.max_encode)
            held = self._slab.store(cross, offset)
            if held is not None:
                return held
        return [c[offset : offset + rows] for c in cross]
