"""Model work as a resumable task: the generator type the engine's decode loop and the service's
window pipeline are written as, the model calls it yields (`DecoderInputs`, `EncoderInputs`,
`AlignerInputs`), and the driver that serves them one by one.

    steps = decode_loop(...)          # Steps[R]: yields a call, is sent that call's outputs
    result = serve_steps(steps, sessions)

A scheduler may instead hold many such tasks and serve their calls together (one decoder call
for all of them per step, several windows per encoder call): the task does not know which.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

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


@dataclass(frozen=True)
class EncoderInputs:
    """One encoder call: log-mel windows f32 [B, n_mels, 3000] -> cross K/V, each
    [B, H, 1500, Dh]."""

    features: np.ndarray


@dataclass(frozen=True)
class AlignerInputs:
    """One aligner call (shapes as `WhisperSessions.align`) -> alignment weights and token
    log-probs."""

    input_ids: np.ndarray
    target_ids: np.ndarray
    cross: list[np.ndarray]


Call = DecoderInputs | EncoderInputs | AlignerInputs
Steps = Generator[Call, Any, T]  # a resumable task returning T


class Serves(Protocol):
    """What serves a task's calls one by one: a model's sessions."""

    def encode(self, features: np.ndarray) -> list[np.ndarray]: ...

    def decode(self, *args: Any) -> DecoderOutputs: ...

    def align(
        self, input_ids: np.ndarray, target_ids: np.ndarray, cross: list[np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray]: ...


def serve(call: Call, model: Serves) -> Any:
    """One call's outputs, from `model`."""
    if isinstance(call, DecoderInputs):
        return model.decode(*call.args())
    if isinstance(call, EncoderInputs):
        return model.encode(call.features)
    return model.align(call.input_ids, call.target_ids, call.cross)


def serve_steps(steps: Steps[T], model: Serves) -> T:
    """Run a task to its end in this thread, each of its calls served by `model`."""
    try:
        call = next(steps)
        while True:
            call = steps.send(serve(call, model))
    except StopIteration as done:
        return done.value
