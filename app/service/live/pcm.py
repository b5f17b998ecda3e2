"""Raw client audio of a live stream -> f32 16 kHz, chunk by chunk."""

from __future__ import annotations

from typing import get_args

import numpy as np
import soxr

from app.engine.audio import AudioDecodeError, PcmEncoding, pcm_to_float
from app.runtime.contract import SAMPLE_RATE
from app.service.live.options import rate_problem

ENCODINGS: tuple[str, ...] = get_args(PcmEncoding)


class PcmInput:
    """Raw client PCM (mono, `encoding`, `sample_rate` Hz) -> f32 16 kHz, chunk by chunk.

    The resampler keeps its state between chunks, so chunk edges leave no artefacts; `finish()`
    returns the samples it still holds. Raises AudioDecodeError for a chunk that is not a whole
    number of samples or holds NaN/infinite floats (the chunk is then dropped).
    """

    def __init__(self, encoding: str, sample_rate: int) -> None:
        if encoding not in ENCODINGS:
            raise ValueError(f"encoding must be one of {', '.join(ENCODINGS)}, got {encoding!r}")
        if (problem := rate_problem(sample_rate)) is not None:
            raise ValueError(f"sample_rate {problem}")
        self.encoding: PcmEncoding = encoding  # type: ignore[assignment]
        self.sample_rate = sample_rate
        self._resampler = (
            soxr.ResampleStream(sample_rate, SAMPLE_RATE, 1, dtype="float32", quality="HQ")
            if sample_rate != SAMPLE_RATE
            else None
        )

    def convert(self, data: bytes) -> np.ndarray:
        """f32 [M] 16 kHz samples of one chunk (M may be 0 while the resampler fills)."""
        audio = self._decode(data)
        if self._resampler is None:
            return audio
        return self._resampler.resample_chunk(audio)

    def _decode(self, data: bytes) -> np.ndarray:
        """f32 [N] mono samples at `sample_rate`."""
        return pcm_to_float(data, self.encoding)

    def finish(self) -> np.ndarray:
        if self._resampler is None:
            return np.zeros(0, np.float32)
        return self._resampler.resample_chunk(np.zeros(0, np.float32), last=True)


_WIDTHS = {1: (np.dtype("u1"), 128.0, 128.0), 2: (np.dtype("<i2"), 0.0, 32768.0),
           4: (np.dtype("<i4"), 0.0, 2147483648.0)}  # fmt: skip
MAX_CHANNELS = 8


class FramedPcm(PcmInput):
    """Interleaved integer PCM as a WAV file holds it -> f32 16 kHz mono, chunk by chunk:
    `width` bytes per sample (1: unsigned 8-bit, 2: signed 16-bit, 4: signed 32-bit, little
    endian), `channels` samples per frame, averaged. Raises ValueError for a format it does not
    take, AudioDecodeError for a chunk that is not a whole number of frames."""

    def __init__(self, sample_rate: int, width: int, channels: int) -> None:
        if width not in _WIDTHS:
            raise ValueError(f"sample width must be 1, 2 or 4 bytes, got {width}")
        if not 1 <= channels <= MAX_CHANNELS:
            raise ValueError(f"channels must be 1..{MAX_CHANNELS}, got {channels}")
        super().__init__("pcm_f32le", sample_rate)
        self.width, self.channels = width, channels

    def check_frames(self, data: bytes) -> None:
        """Raise AudioDecodeError unless `data` is a whole number of frames."""
        frame = self.width * self.channels
        size = memoryview(data).nbytes
        if size % frame:
            raise AudioDecodeError(
                f"audio must be whole frames of {frame} bytes ({self.width}-byte samples x "
                f"{self.channels} channel(s)); got {size} bytes"
            )

    def _decode(self, data: bytes) -> np.ndarray:
        self.check_frames(data)
        dtype, offset, scale = _WIDTHS[self.width]
        samples = (np.frombuffer(data, dtype).astype(np.float32) - offset) / np.float32(scale)
        return samples.reshape(-1, self.channels).mean(axis=1, dtype=np.float32)
