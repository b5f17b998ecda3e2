"""Kaldi's log mel filterbank (`compute-fbank-feats` defaults as CAM++ was trained on), in numpy.

25 ms frames every 10 ms without edge padding (snip_edges), DC removed, pre-emphasis 0.97, Povey
window, 512-point power spectrum, 80 triangular bins on Kaldi's mel scale from 20 Hz to 8 kHz,
natural log floored at float32 epsilon; no dither, no energy. Samples are scaled to 16-bit range
first, as Kaldi reads wav files. `mean_normalised` subtracts each bin's mean over the frames
(what the embedding model expects).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from app.runtime.contract import SAMPLE_RATE
from app.runtime.speaker_contract import FBANK_BINS

FRAME_LENGTH = 400  # samples (25 ms)
FRAME_SHIFT = 160  # samples (10 ms)
N_FFT = 512  # the frame zero-padded to a power of two
N_BINS = FBANK_BINS
LOW_HZ = 20.0
PREEMPHASIS = 0.97
_EPSILON = np.finfo(np.float32).eps
_BLOCK_FRAMES = 4096  # frames transformed at a time (bounds memory for long audio)


def _mel(hz: np.ndarray | float) -> np.ndarray:
    return 1127.0 * np.log1p(np.asarray(hz, np.float64) / 700.0)


@lru_cache(maxsize=1)
def kaldi_mel_banks() -> np.ndarray:
    """Triangular filters f64 [N_BINS, N_FFT // 2 + 1] (the Nyquist bin gets no weight)."""
    edges = np.linspace(_mel(LOW_HZ), _mel(SAMPLE_RATE / 2), N_BINS + 2)
    left, centre, right = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    bins = _mel(np.arange(N_FFT // 2) * SAMPLE_RATE / N_FFT)[None, :]
    rising = (bins - left) / (centre - left)
    falling = (right - bins) / (right - centre)
    weights = np.where(bins <= centre, rising, falling)
    weights = np.where((bins > left) & (bins < right), weights, 0.0)
    banks = np.zeros((N_BINS, N_FFT // 2 + 1))
    banks[:, : N_FFT // 2] = weights
    banks.flags.writeable = False
    return banks


@lru_cache(maxsize=1)
def _povey_window() -> np.ndarray:
    n = np.arange(FRAME_LENGTH)
    return (0.5 - 0.5 * np.cos(2 * np.pi * n / (FRAME_LENGTH - 1))) ** 0.85


def frame_count(n_samples: int) -> int:
    """Frames of `n_samples` samples: 1 + (n - 400) // 160, none below 400 samples."""
    return 0 if n_samples < FRAME_LENGTH else 1 + (n_samples - FRAME_LENGTH) // FRAME_SHIFT


def fbank(audio: np.ndarray) -> np.ndarray:
    """Log mel filterbank f32 [frames, 80] of 16 kHz mono audio f32 [N] in [-1, 1]."""
    audio = np.asarray(audio, np.float32)
    if audio.ndim != 1:
        raise ValueError(f"audio must be 1-D [N] samples, got shape {audio.shape}")
    n_frames = frame_count(audio.shape[0])
    out = np.empty((n_frames, N_BINS), np.float32)
    if n_frames == 0:
        return out
    scaled = audio.astype(np.float64) * 32768.0
    frames = np.lib.stride_tricks.sliding_window_view(scaled, FRAME_LENGTH)[::FRAME_SHIFT]
    banks = kaldi_mel_banks().T  # [257, 80]
    window = _povey_window()
    for start in range(0, n_frames, _BLOCK_FRAMES):
        block = frames[start : start + _BLOCK_FRAMES]
        block = block - block.mean(axis=1, keepdims=True)
        emphasised = np.empty_like(block)
        emphasised[:, 1:] = block[:, 1:] - PREEMPHASIS * block[:, :-1]
        emphasised[:, 0] = block[:, 0] * (1.0 - PREEMPHASIS)
        spectrum = np.fft.rfft(emphasised * window, n=N_FFT, axis=1)
        power = spectrum.real**2 + spectrum.imag**2
        out[start : start + len(block)] = np.log(np.maximum(power @ banks, _EPSILON))
    return out


def mean_normalised(features: np.ndarray) -> np.ndarray:
    """Each bin minus its mean over the frames (f32 [frames, 80])."""
    if len(features) == 0:
        return features
    return (features - features.mean(axis=0, keepdims=True)).astype(np.float32)
