"""What the batching scheduler queues and how it packs one-token decoder calls into batches.

`DecodeCall` / `EncodeCall` / `AlignCall`: one caller's model call, waiting for its result.
`Layout`: where each call's rows sit in one batched decoder call; `pack_by_slot` (windows in the
cross K/V slab) and `pack_groups` (the others) make them; `stacked_cross` copies a group's cross
K/V together when they are not in the slab. `InputScratch`: a lane's input arrays, kept from one
step to the next. Pure data and packing: the scheduler (`app.service.batching.scheduler`) runs
the calls.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from app.runtime.steps import AlignerInputs, DecoderInputs
from app.service.batching.cross_slab import CrossKV


@dataclass(eq=False)
class PendingCall:
    """A caller's model call (`caller`: its thread ident) waiting for its result."""

    caller: int
    rows: int
    arrived: float = field(default_factory=time.perf_counter, init=False)
    done: threading.Event = field(default_factory=threading.Event, init=False)
    result: object = field(default=None, init=False)
    error: BaseException | None = field(default=None, init=False)
    # called with (result, error) by the lane once the call is served, instead of a waiting caller
    then: Callable[[object, BaseException | None], None] | None = field(default=None, init=False)

    def finish(self, result: object = None, error: BaseException | None = None) -> None:
        self.result, self.error = result, error
        self.done.set()

    def outcome(self) -> object:
        """Block until finished: the result, or raise the error."""
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.result


@dataclass(eq=False)
class EncodeCall(PendingCall):
    features: np.ndarray  # f32 [B, n_mels, 3000]


@dataclass(eq=False)
class AlignCall(PendingCall):
    inputs: AlignerInputs


@dataclass(eq=False)
class DecodeCall(PendingCall):
    inputs: DecoderInputs

    @classmethod
    def of(cls, caller: int, inputs: DecoderInputs) -> DecodeCall:
        return cls(caller, inputs.rows, inputs=inputs)

    @property
    def past_len(self) -> int:
        return self.inputs.past_len

    @property
    def new_tokens(self) -> int:
        return self.inputs.new_tokens

    @property
    def cross(self) -> list[np.ndarray]:
        return self.inputs.cross

    @property
    def kind(self) -> str:
        """StepRecord kind: "decode" (one new token per row) or "prefill"."""
        return "decode" if self.new_tokens == 1 else "prefill"


@dataclass(frozen=True)
class Layout:
    """Where each call's rows sit in one decoder batch: `offsets[i]` for `calls[i]`; rows not
    covered by any call are dummy rows."""

    calls: list[DecodeCall]
    offsets: list[int]
    rows: int


def padding(layout: Layout) -> float:
    longest = max(c.past_len for c in layout.calls)
    used = sum(c.rows * c.past_len for c in layout.calls)
    return 1.0 - used / (layout.rows * longest) if longest else 0.0


def stacked_cross(stacked: dict, key: tuple, layout: Layout) -> list[np.ndarray]:
    """Cross K/V of the layout's rows stacked along the batch axis ([R, H, 1500, Dh] per
    layer; a batch-1 window is repeated over its rows); reused while the members stay.
    `stacked`: a lane's copies by group membership (`key`), kept between steps."""
    found = stacked.get(key)
    if found is not None and all(a is c.cross for a, c in zip(found[0], layout.calls, strict=True)):
        return found[1]
    arrays = []
    for layer in range(len(layout.calls[0].cross)):
        first = layout.calls[0].cross[layer]
        out = np.empty((layout.rows, *first.shape[1:]), first.dtype)
        for call, offset in zip(layout.calls, layout.offsets, strict=True):
            out[offset : offset + call.rows] = call.cross[layer]  # broadcasts batch 1
        arrays.append(out)
    stacked[key] = ([c.cross for c in layout.calls], arrays)
    return arrays


class InputScratch:
    """A decoder lane's input arrays for batched calls, kept from one step to the next by shape
    (rows, new tokens T, past length P): a step shaped like one of the previous iteration writes
    its inputs into the same arrays instead of allocating and zero-filling tens of MB (with the
    service's malloc settings each fresh array is a new mapping, page-faulted in every step)."""

    def __init__(self) -> None:
        self._arrays: dict[tuple[int, int, int], tuple] = {}
        self._used: set[tuple[int, int, int]] = set()

    def take(
        self, rows: int, new_tokens: int, longest: int, like_past: list[np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[np.ndarray]]:
        """input_ids [R, T], position_ids [R, T], attention_mask [R, P + T] (all int64) and one
        past array [R, H, P, Dh] per entry of `like_past`. Contents are left from an earlier
        step (finite values); the caller writes every element a call depends on."""
        key = (rows, new_tokens, longest)
        self._used.add(key)
        found = self._arrays.get(key)
        if found is None:
            found = (
                np.zeros((rows, new_tokens), np.int64),
                np.zeros((rows, new_tokens), np.int64),
                np.zeros((rows, longest + new_tokens), np.int64),
                [np.zeros((rows, p.shape[1], longest, p.shape[3]), p.dtype) for p in like_past],
            )
            self._arrays[key] = found
        return found

    def drop_unused(self) -> None:
        """Forget the arrays no call of this iteration used."""
        for key in set(self._arrays) - self._used:
            del self._arrays[key]
        self._used.clear()

    def clear(self) -> None:
        self._arrays.clear()
        self._used.clear()


def pack_by_slot(
    calls: list[DecodeCall], max_rows: int, max_padding: float
) -> list[tuple[int, Layout]]:
    """Single-row calls on slab windows, in slot order, cut into runs of at most `max_rows`
    consecutive slots (gaps become dummy rows) with at most `max_padding` padding.
    Returns (first slot, layout) per run."""
    runs: list[tuple[int, Layout]] = []
    for call in sorted(calls, key=lambda c: cross_slot(c)):
        slot = cross_slot(call)
        if runs:
            lo, layout = runs[-1]
            candidate = Layout([*layout.calls, call], [*layout.offsets, slot - lo], slot - lo + 1)
            if candidate.rows <= max_rows and padding(candidate) <= max_padding:
                runs[-1] = (lo, candidate)
                continue
        runs.append((slot, Layout([call], [0], 1)))
    return runs


def pack_groups(calls: list[DecodeCall], max_rows: int, max_padding: float) -> list[Layout]:
    """Other one-token calls, sorted by past length (longest first), packed back to back into
    groups of at most `max_rows` rows (a bigger call is a group of its own) and at most
    `max_padding` padding."""
    groups: list[Layout] = []
    for call in sorted(calls, key=lambda c: c.past_len, reverse=True):
        if groups:
            last = groups[-1]
            candidate = Layout(
                [*last.calls, call], [*last.offsets, last.rows], last.rows + call.rows
            )
            if candidate.rows <= max_rows and padding(candidate) <= max_padding:
                groups[-1] = candidate
                continue
        groups.append(Layout([call], [0], call.rows))
    return groups


def cross_slot(call: DecodeCall) -> int:
    """The slab slot of a call whose cross K/V are a `CrossKV`."""
    cross = call.cross
    assert isinstance(cross, CrossKV)
    return cross.slot


def assemble(
    layout: Layout, scratch: InputScratch
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[np.ndarray]]:
    """The inputs of one decoder call for the calls of `layout` (the same T and `logits_at`),
    written into `scratch`'s arrays: each call's rows at its offset, its past left-padded to the
    group's longest (masked), dummy rows attending to their own tokens only."""
    longest = max(c.past_len for c in layout.calls)
    input_ids, position_ids, mask, past = scratch.take(
        layout.rows, layout.calls[0].new_tokens, longest, layout.calls[0].inputs.past
    )
    input_ids[:] = 0  # dummy rows: token 0, position 0
    position_ids[:] = 0
    mask[:] = 0  # [R, P + T], 0 = padding
    mask[:, longest:] = 1
    for call, offset in zip(layout.calls, layout.offsets, strict=True):
        rows_of = slice(offset, offset + call.rows)
        pad = longest - call.past_len
        input_ids[rows_of] = call.inputs.input_ids
        position_ids[rows_of] = call.inputs.position_ids
        mask[rows_of, pad:] = call.inputs.attention_mask
        for dst, src in zip(past, call.inputs.past, strict=True):
            dst[rows_of, :, :pad] = 0
            dst[rows_of, :, pad:] = src
    return input_ids, position_ids, mask, past
