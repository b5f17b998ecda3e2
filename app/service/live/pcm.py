"""Raw client audio of a live stream -> f32 16 kHz, chunk by chunk."""

from __future__ import annotations

from typing import get_args

import numpy as np
import soxr

from app.engine.audio import PcmEncoding, pcm_to_float
from app.runtime.contract import SAMPLE_RATE

ENCODINGS: tuple[str, ...] = get_args(PcmEncoding)
MIN_RATE, MAX_RATE = 8000, 192000


class PcmInput:
    """Raw client PCM (mono, `encoding`, `sample_rate` Hz) -> f32 16 kHz, chunk by chunk.

    The resampler keeps its state between chunks, so chunk edges leave no artefacts; `finish()`
    returns the samples it still holds. Raises AudioDecodeError for a chunk that is not a whole
    number of samples or holds NaN/infinite floats (the chunk is then dropped).
    """

    def __init__(self, encoding: str, sample_rate: int) -> None:
        if encoding not in ENCODINGS:
            raise ValueError(f"encoding must be one of {', '.join(ENCODINGS)}, got {encoding!r}")
        if not MIN_RATE <= sample_rate <= MAX_RATE:
            raise ValueError(f"sample_rate must be in {MIN_RATE}..{MAX_RATE} Hz, got {sample_rate}")
        self.encoding: PcmEncoding = encoding  # type: ignore[assignment]
        self.sample_rate = sample_rate
        self._resampler = (
            soxr.ResampleStream(sample_rate, SAMPLE_RATE, 1, dtype="float32", quality="HQ")
            if sample_rate != SAMPLE_RATE
            else None
        )

    def convert(self, data: bytes) -> np.ndarray:
        """f32 [M] 16 kHz samples of one chunk (M may be 0 while the resampler fills)."""
        audio = pcm_to_float(data, self.encoding)
        if self._resampler is None:
            return audio
        return self._resampler.resample_chunk(audio)

    def finish(self) -> np.ndarray:
        if self._resampler is None:
            return np.zeros(0, np.float32)
        return self._resampler.resample_chunk(np.zeros(0, np.float32), last=True)
