"""A decode as a resumable task: the generator type the engine's decode loop is written as, the
inputs of one decoder call it yields, and the driver that serves it call by call.

    steps = decode_loop(...)          # Steps[R]: yields DecoderInputs, is sent DecoderOutputs
    result = serve_steps(steps, sessions.decode)

A scheduler may instead hold many such tasks and serve their calls together (one decoder call
for all of them per step): the task does not know which.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

T = TypeVar("T")
DecoderOutputs = tuple[np.ndarray, list[np.ndarray]]  # logits [R, K, V], new self K/V [R, H, T, Dh]


@dataclass(frozen=True)
class DecoderInputs:
    """One decoder call's inputs (shapes as `WhisperSessions.decode`): input_ids and
    position_ids int64 [R, T], attention_mask int64 [R, P + T], past [R, H, P, Dh] per layer and
    kind, cross [1 or R, H, 1500, Dh] per layer and kind, logits_at int64 [K] (None: logits at
    all T new positions)."""

    input_ids: np.ndarray
    position_ids: np.ndarray
    attention_mask: np.ndarray
    past: list[np.ndarray]
    cross: list[np.ndarray]
    logits_at: np.ndarray | None = None

    @property
    def rows(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def new_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    @property
    def past_len(self) -> int:
        return int(self.past[0].shape[2])

    @property
    def shape_key(self) -> tuple[int, tuple[int, ...] | None]:
        """Calls with the same key can share one decoder call: the same T and `logits_at`."""
        at = None if self.logits_at is None else tuple(int(i) for i in self.logits_at)
        return self.new_tokens, at

    def args(self) -> tuple:
        """The positional arguments of `WhisperSessions.decode`."""
        return (
            self.input_ids, self.position_ids, self.attention_mask, self.past, self.cross,
            self.logits_at,
        )  # fmt: skip


Steps = Generator[DecoderInputs, DecoderOutputs, T]  # a resumable decode returning T


def serve_steps(steps: Steps[T], decode: Callable[..., DecoderOutputs]) -> T:
    """Run a resumable decode to its end in this thread, `decode(*inputs.args())` per call."""
    try:
        inputs = next(steps)
        while True:
            inputs = steps.send(decode(*inputs.args()))
    except StopIteration as done:
        return done.value
