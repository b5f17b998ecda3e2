"""Calls of any row count on a device that compiles a graph for fixed input shapes only (NPU).

Such a graph is compiled at load for a few shapes (`contract.static_feed_shapes`: the encoder's
window, the decoder's static-cache step at a few row counts, word timing's fixed-width prefill),
so no request waits on a compile. A call of another row count is served by them, as pure data
(`pieces`): its rows padded up to the smallest compiled row count that holds them (the extra rows
repeat its last row; their outputs are dropped), or split into pieces of the largest. An input
whose shape is the compiled one as it is (the window's cross K/V, batch 1, broadcast over beams;
`logits_at`) goes to every piece whole. A call no compiled shape fits gets no pieces: the caller
compiles its own shape (and counts it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

Shapes = tuple[tuple[str, tuple[int, ...]], ...]  # (input name, shape), sorted by name


def key_of(shapes: Mapping[str, Sequence[int]]) -> Shapes:
    """Input shapes as a compiled graph's key (independent of their order)."""
    return tuple(sorted((name, tuple(int(d) for d in shape)) for name, shape in shapes.items()))


def shapes_of(feed: Mapping[str, np.ndarray]) -> Shapes:
    """A call's input shapes as a compiled graph's key."""
    return key_of({name: a.shape for name, a in feed.items()})


def batch_rows(max_rows: int) -> tuple[int, ...]:
    """The row counts a static device compiles for batched steps (a row per window) when a
    step may batch up to `max_rows` rows: the powers of two from 2 below it, and it (8: 2, 4, 8;
    a batch of 3 then runs padded to 4, never to 8)."""
    counts = {max_rows} if max_rows >= 2 else set()
    counts.update(2**i for i in range(1, max_rows.bit_length()) if 2**i < max_rows)
    return tuple(sorted(counts))


def rows_of(shapes: Shapes) -> int:
    """The call's row count: the largest first dimension of its inputs of rank >= 2 (an input
    of one row beside others of R rows is broadcast over them)."""
    return max((shape[0] for _, shape in shapes if len(shape) >= 2), default=1)


@dataclass(frozen=True)
class Piece:
    """Rows [start, stop) of the call's per-row inputs (`batched`), run as the compiled shapes
    `key` (padded up to its row count); every other input goes whole."""

    start: int
    stop: int
    key: Shapes
    batched: frozenset[str]

    @property
    def padding(self) -> int:
        return rows_of(self.key) - (self.stop - self.start)


def _per_row(shapes: Shapes, key: Shapes) -> frozenset[str] | None:
    """The call's inputs that go row by row when it runs as `key` (of any row count); None when
    its other inputs are not `key`'s as they are."""
    compiled = dict(key)
    if compiled.keys() != {name for name, _ in shapes}:
        return None
    rows, target = rows_of(shapes), rows_of(key)
    per_row = set()
    for name, shape in shapes:
        want = compiled[name]
        if len(shape) >= 2 and shape[0] == rows and want[0] == target:
            if want[1:] != shape[1:]:
                return None
            per_row.add(name)
        elif want != shape:
            return None
    return frozenset(per_row)


def pieces(shapes: Shapes, compiled: Iterable[Shapes]) -> list[Piece]:
    """How a call of `shapes` runs on the `compiled` shapes: one piece on the smallest compiled
    row count that holds its rows, else pieces of the largest that fits; [] when none fits."""
    rows = rows_of(shapes)
    fitting = sorted(
        ((rows_of(key), key, per_row) for key in set(compiled)
         if (per_row := _per_row(shapes, key)) is not None),
        key=lambda found: found[0],
    )  # fmt: skip
    for target, key, per_row in fitting:
        if target >= rows:
            return [Piece(0, rows, key, per_row)]
    if not fitting:
        return []
    target, key, per_row = fitting[-1]
    return [
        Piece(start, min(start + target, rows), key, per_row) for start in range(0, rows, target)
    ]


def piece_feed(feed: Mapping[str, np.ndarray], piece: Piece) -> dict[str, np.ndarray]:
    """The feed of one piece: its rows of the batched inputs, padded by repeating the last."""
    fed = {}
    for name, array in feed.items():
        if name in piece.batched:
            part = array[piece.start : piece.stop]
            if piece.padding:
                part = np.concatenate([part, np.repeat(part[-1:], piece.padding, axis=0)])
            array = part
        fed[name] = array
    return fed
