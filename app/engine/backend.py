"""What the engine needs from a model's runtime: the seam between decoding and execution.

Model work is a resumable task (`app.runtime.steps.Steps`): a generator that yields each model
call it needs (encoder, decoder, aligner) and is sent that call's outputs, until it returns its
result. The backend serves it (`run_steps`, blocking; `start`, a future):
`app.runtime.sessions.WhisperSessions` makes each call in the caller's thread; the service's
batching scheduler (`app.service.batching.scheduler.BatchingSessions`) advances every task on its
lanes, one decoder call per step for all of them, no caller's thread waiting.
Shapes follow the I/O contract (`app.runtime.contract`).
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Protocol, TypeVar

import numpy as np

from app.runtime.contract import Manifest
from app.runtime.steps import Steps

T = TypeVar("T")


class WhisperBackend(Protocol):
    """Encoder, decoder and aligner calls of one loaded model; safe to call from many threads."""

    @property
    def manifest(self) -> Manifest: ...

    @property
    def devices(self) -> dict[str, str]: ...

    @property
    def arithmetic(self) -> dict[str, str]:
        """What each stage computes in (precision; how its int8-input layers multiply)."""
        ...

    @property
    def static(self) -> bool:
        """The decoder runs on a device that compiles fixed input shapes only (NPU): every decode
        uses the static cache (`kv_cache.make_cache`), the aligner one fixed width (`align`)."""
        ...

    @property
    def kv_dtype(self) -> np.dtype:
        """The dtype of every K/V array the calls take and give (f32, or bf16 where the decoder
        computes bf16)."""
        ...

    def encode(self, features: np.ndarray) -> list[np.ndarray]:
        """features f32 [B, n_mels, 3000] -> [cross_k_0, cross_v_0, ...], each [B, H, 1500, Dh]."""
        ...

    def decode(
        self,
        input_ids: np.ndarray,
        position_ids: np.ndarray,
        attention_mask: np.ndarray,
        past: list[np.ndarray],
        cross: list[np.ndarray],
        logits_at: np.ndarray | None = None,
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """One decoder call -> logits f32 [B, K, V] at the new positions `logits_at` i64 [K]
        (None: all T) and the new self K/V [B, H, T, Dh]."""
        ...

    def run_steps(self, steps: Steps[T]) -> T:
        """Serve every model call of a resumable task; its result (blocking)."""
        ...

    def start(self, steps: Steps[T]) -> Future[T]:
        """Serve a resumable task's model calls, here or on the backend's own threads; its
        future result."""
        ...

    def align(
        self, input_ids: np.ndarray, target_ids: np.ndarray, cross: list[np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray]:
        """The aligner -> alignment weights f32 [B, A, T, 1500], token log-probs f32 [B, T]."""
        ...

    def empty_past(self, batch: int = 1) -> list[np.ndarray]:
        """Zero-length self K/V [batch, H, 0, Dh]."""
        ...
