"""How the batching scheduler packs one-token decoder calls into batches (no model needed)."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from app.runtime.steps import DecoderInputs
from app.service.batching.cross_slab import CrossSlab
from app.service.batching.pack import (
    DecodeCall,
    InputScratch,
    pack_by_slot,
    pack_groups,
    padding,
)
from app.service.batching.records import BatchingOptions
from app.service.batching.scheduler import _same_cpu

H, DH, CTX = 2, 4, 6  # heads, head size, audio positions


def slab(slots: int = 8) -> CrossSlab:
    return CrossSlab([np.zeros((1, H, CTX, DH), np.float32)] * 2, slots)


def call(past_len: int, rows: int = 1, cross: list | None = None) -> DecodeCall:
    """A one-token decoder call of `rows` rows with `past_len` cached positions."""
    past = [np.zeros((rows, H, past_len, DH), np.float32)] * 2
    cross = cross if cross is not None else [np.zeros((1, H, CTX, DH), np.float32)] * 2
    inputs = DecoderInputs(
        np.zeros((rows, 1), np.int64),
        np.full((rows, 1), past_len, np.int64),
        np.ones((rows, past_len + 1), np.int64),
        past,
        cross,
    )
    return DecodeCall.of(0, inputs)


def test_options_are_validated() -> None:
    with pytest.raises(ValueError, match="max_rows"):
        BatchingOptions(max_rows=0)
    with pytest.raises(ValueError, match="max_padding"):
        BatchingOptions(max_padding=1.0)


def test_groups_respect_row_cap_and_keep_big_calls_whole() -> None:
    calls = [call(10, rows=5), call(10, rows=5), call(10), call(10), call(10, rows=9)]
    groups = pack_groups(calls, max_rows=8, max_padding=0.9)
    assert sorted(g.rows for g in groups) == [5, 7, 9]
    for group in groups:
        assert group.offsets == list(np.cumsum([0] + [c.rows for c in group.calls[:-1]]))


def test_groups_boundpadding() -> None:
    long, short = call(100), call(2)
    assert len(pack_groups([long, short], max_rows=8, max_padding=0.4)) == 2
    (together,) = pack_groups([long, short], max_rows=8, max_padding=0.6)
    assert padding(together) == pytest.approx(1 - 102 / 200)


def test_slot_runs_are_contiguous_with_dummy_rows_for_gaps() -> None:
    s = slab()
    held = [s.store([np.ones((1, H, CTX, DH), np.float32) * i] * 2, 0) for i in range(5)]
    calls = {slot: call(20, cross=held[slot]) for slot in (0, 1, 3, 4)}  # slot 2 is away
    runs = pack_by_slot(list(calls.values()), max_rows=8, max_padding=0.5)
    assert len(runs) == 1
    lo, layout = runs[0]
    assert (lo, layout.rows, layout.offsets) == (0, 5, [0, 1, 3, 4])
    view = s.view(lo, lo + layout.rows)
    assert np.shares_memory(view[0], s.arrays[0]) and view[0][3, 0, 0, 0] == 3
    # a cap of 3 rows cuts the run; slot order is kept
    runs = pack_by_slot(list(calls.values()), max_rows=3, max_padding=0.5)
    assert [(lo, layout.offsets) for lo, layout in runs] == [(0, [0, 1]), (3, [0, 1])]


def test_slab_slots_are_freed_with_their_window_and_reused_lowest_first() -> None:
    s = slab(slots=2)
    encoder_out = [np.ones((2, H, CTX, DH), np.float32)] * 2
    first, second = s.store(encoder_out, 0), s.store(encoder_out, 1)
    assert (first.slot, second.slot, s.used) == (0, 1, 2)
    assert s.store(encoder_out, 0) is None, "no slot left"
    del first
    gc.collect()
    assert s.used == 1 and s.store(encoder_out, 0).slot == 0


def test_compaction_moves_windows_down_and_repoints_their_views() -> None:
    s = slab(slots=4)
    windows = [s.store([np.full((1, H, CTX, DH), i, np.float32)] * 2, 0) for i in range(3)]
    del windows[1]  # slot 1 frees
    gc.collect()
    assert s.compact() == 1
    last = windows[1]
    assert last.slot == 1 and s.used == 2
    assert np.shares_memory(last[0], s.view(1, 2)[0]) and (last[0] == 2).all()
    assert s.compact() == 0, "already packed"
    del last, windows
    gc.collect()
    assert s.used == 0, "the moved window frees its new slot"


def test_a_freed_slot_gives_its_memory_pages_back() -> None:
    """Whole pages of a freed slot are returned to the system (they read as zeros after), the
    other slots keep their data."""
    window = [np.full((1, 2, 1500, 64), 7, np.float32)] * 2  # 768 kB per slot and layer
    s = CrossSlab(window, slots=3)
    kept, dropped = s.store(window, 0), s.store(window, 0)
    del dropped
    gc.collect()
    released = (s.arrays[0][1] == 0).mean()
    assert released > 0.99, "all but the partial edge pages of the freed slot read as zeros"
    assert (kept[0] == 7).all() and (s.arrays[1][0] == 7).all()


@pytest.mark.parametrize(
    ("devices", "same"),
    [
        ({"encoder": "CPU", "decoder": "CPU"}, True),
        ({"encoder": "NPU", "decoder": "CPU"}, False),
        ({"encoder": "GPU.0", "decoder": "GPU.1"}, False),
        ({"encoder": "GPU", "decoder": "GPU"}, False),
    ],
)
def test_only_stages_both_on_the_cpu_take_turns(devices: dict[str, str], same: bool) -> None:
    assert _same_cpu(devices) is same


def test_input_scratch_reuses_arrays_of_a_shape_seen_in_the_last_iteration() -> None:
    like = [np.zeros((1, H, 3, DH), np.float32)] * 2
    scratch = InputScratch()
    ids, positions, mask, past = scratch.take(4, 1, 64, like)
    assert (ids.shape, positions.shape, mask.shape) == ((4, 1), (4, 1), (4, 65))
    assert [p.shape for p in past] == [(4, H, 64, DH)] * 2 and past[0] is not past[1]
    assert not any(np.any(a) for a in (ids, positions, mask, *past)), "fresh arrays are zeros"
    scratch.drop_unused()
    again = scratch.take(4, 1, 64, like)
    assert again[0] is ids and again[3][1] is past[1], "same shape next step: same arrays"
    other = scratch.take(4, 1, 128, like)
    assert other[3][0].shape == (4, H, 128, DH)
    scratch.drop_unused()
    scratch.drop_unused()  # an iteration that used neither shape
    assert scratch.take(4, 1, 64, like)[0] is not ids, "unused shapes are forgotten"
