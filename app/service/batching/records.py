"""The batching scheduler's data: how it batches (`BatchingOptions`, validated once) and what it
did (`StepRecord` per model call, `BatchingStats` totals, both kept by a `StepLog`). Used by the
scheduler (`app.service.batching.scheduler`), the metrics and the benchmarks.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)


class SchedulerClosedError(RuntimeError):
    """The batching scheduler was closed (the server is shutting down)."""


@dataclass(frozen=True)
class BatchingOptions:
    """max_rows: decoder rows per call (sequences; a beam-5 decode is 5 rows).
    max_padding: largest share of a group's past K/V slots that may be padding, in [0, 1).
    max_encode: 30 s windows per encoder call.
    encoder_share: when the encoder and the decoder run on the same CPU they take turns
        (`CoreTurns`); the largest share of time, in (0, 1], that encoder calls take while
        decodes run."""

    max_rows: int = 8
    max_padding: float = 0.6
    max_encode: int = 2
    encoder_share: float = 0.5

    def __post_init__(self) -> None:
        if self.max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {self.max_rows}")
        if not 0.0 <= self.max_padding < 1.0:
            raise ValueError(f"max_padding must be in [0, 1), got {self.max_padding}")
        if self.max_encode < 1:
            raise ValueError(f"max_encode must be >= 1, got {self.max_encode}")
        if not 0.0 < self.encoder_share <= 1.0:
            raise ValueError(f"encoder_share must be in (0, 1], got {self.encoder_share}")


@dataclass(frozen=True)
class StepRecord:
    """One model call made by the scheduler.

    kind: "decode" (one new token per row), "prefill" (several: prompt chunks), "encode" or
        "align" (word timing's aligner).
    rows: batch size of the call; calls: callers served by it.
    padding_ratio: share of the past K/V slots that were padding (0 for prefill and encode).
    queue_wait_s: longest time a served call waited between its submission and the call's start.
    seconds: wall time of the model call, assembling inputs and splitting outputs included.
    """

    kind: str
    rows: int
    calls: int
    padding_ratio: float
    queue_wait_s: float
    seconds: float


@dataclass
class BatchingStats:
    """Totals since start: model calls by kind, sequences (rows without dummy rows) served by
    decode steps."""

    decode_steps: int = 0
    decode_rows: int = 0
    prefill_calls: int = 0
    encode_calls: int = 0
    encode_windows: int = 0

    @property
    def mean_rows_per_step(self) -> float:
        return self.decode_rows / self.decode_steps if self.decode_steps else 0.0


class StepLog:
    """What both lanes of a scheduler did: the totals (`stats`) and the observers told of each
    model call (on the lane's thread; an observer's error is logged, never raised)."""

    def __init__(self) -> None:
        self.stats = BatchingStats()
        self._lock = threading.Lock()
        self._observers: list[Callable[[StepRecord], None]] = []

    def add_observer(self, observer: Callable[[StepRecord], None]) -> None:
        self._observers.append(observer)

    def log(self, record: StepRecord, served_rows: int = 0) -> None:
        """One model call; `served_rows`: a decode step's rows without its dummy rows."""
        with self._lock:
            stats = self.stats
            if record.kind == "decode":
                stats.decode_steps += 1
                stats.decode_rows += served_rows
            elif record.kind == "prefill":
                stats.prefill_calls += 1
            elif record.kind == "encode":
                stats.encode_calls += 1
                stats.encode_windows += record.rows
        for observer in self._observers:
            try:
                observer(record)
            except Exception:  # a metrics hiccup must not fail a decode
                log.exception("batching observer failed")
