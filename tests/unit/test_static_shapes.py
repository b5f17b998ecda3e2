"""How a call of any row count runs on the few shapes a static device compiled at load
(`app.runtime.static_shapes`): on shapes only, no device."""

from __future__ import annotations

import numpy as np

from app.runtime.static_shapes import (
    Piece,
    batch_rows,
    key_of,
    piece_feed,
    pieces,
    rows_of,
    shapes_of,
)


def step(rows: int, cross_rows: int = 1) -> dict[str, tuple[int, ...]]:
    """A decoder step's shapes (two inputs per row, a broadcast cross, logits_at)."""
    return {
        "input_ids": (rows, 1),
        "past_k_0": (rows, 2, 8, 4),
        "cross_k_0": (cross_rows, 2, 15, 4),
        "logits_at": (1,),
    }


COMPILED = [key_of(step(1)), key_of(step(5))]


def test_a_call_of_a_compiled_shape_runs_as_it_is() -> None:
    assert pieces(key_of(step(5)), COMPILED) == [
        Piece(0, 5, key_of(step(5)), frozenset({"input_ids", "past_k_0"}))
    ]


def test_rows_are_padded_up_to_the_smallest_compiled_row_count_that_holds_them() -> None:
    (piece,) = pieces(key_of(step(3)), COMPILED)
    assert piece.key == key_of(step(5)) and piece.padding == 2
    assert piece.batched == {"input_ids", "past_k_0"}  # the broadcast cross goes whole
    (piece,) = pieces(key_of(step(3)), [key_of(step(n)) for n in (8, 1, 4)])
    assert piece.key == key_of(step(4)) and piece.padding == 1


def test_more_rows_than_any_compiled_shape_are_split_into_pieces_of_the_largest() -> None:
    split = pieces(key_of(step(12)), COMPILED)
    assert [(p.start, p.stop, p.padding) for p in split] == [(0, 5, 0), (5, 10, 0), (10, 12, 3)]
    assert {p.key for p in split} == {key_of(step(5))}


def test_an_input_with_a_row_per_row_is_split_with_the_rows() -> None:
    compiled = [key_of(step(4, cross_rows=4))]
    split = pieces(key_of(step(6, cross_rows=6)), compiled)
    assert [(p.start, p.stop) for p in split] == [(0, 4), (4, 6)]
    assert all("cross_k_0" in p.batched for p in split)


def test_a_call_no_compiled_shape_fits_gets_no_pieces() -> None:
    other_past = {**step(1), "past_k_0": (1, 2, 9, 4)}
    assert pieces(key_of(other_past), COMPILED) == []
    assert pieces(key_of({**step(1), "extra": (1, 1)}), COMPILED) == []


def test_a_piece_feed_pads_with_the_last_row_and_passes_the_rest_whole() -> None:
    feed = {
        "input_ids": np.arange(3)[:, None],
        "past_k_0": np.zeros((3, 2, 8, 4)),
        "cross_k_0": np.ones((1, 2, 15, 4)),
        "logits_at": np.zeros(1, np.int64),
    }
    (piece,) = pieces(shapes_of(feed), COMPILED)
    fed = piece_feed(feed, piece)
    assert fed["input_ids"][:, 0].tolist() == [0, 1, 2, 2, 2]
    assert fed["cross_k_0"] is feed["cross_k_0"] and fed["logits_at"] is feed["logits_at"]
    assert shapes_of(fed) == piece.key


def test_the_rows_of_a_call_are_its_largest_first_dimension_of_rank_two_or_more() -> None:
    assert rows_of(key_of(step(3))) == 3
    assert rows_of(key_of({"logits_at": (7,)})) == 1


def test_batched_steps_compile_powers_of_two_up_to_the_largest_batch() -> None:
    assert batch_rows(8) == (2, 4, 8)
    assert batch_rows(6) == (2, 4, 6)
    assert batch_rows(2) == (2,)
    assert batch_rows(1) == ()
