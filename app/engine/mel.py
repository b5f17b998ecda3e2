"""Whisper's log-mel spectrogram in numpy (no torch, no librosa at run time, no numba).

Units: audio in samples at 16 kHz; mel frames of 10 ms (hop 160 samples), 3000 frames = 30 s.
Long-form audio: compute the log-mel of the whole clip once (the -8 floor is relative to the
whole clip's maximum, as in openai/whisper), then slice windows of `N_FRAMES` frames from it:
frame f covers audio from f * 0.01 s. Pass `padding=N_SAMPLES_PER_WINDOW` to append 30 s of
silence as openai/whisper does, so the last window's tail is the log-mel of silence, not zeros.

Computed in float32 (as torch.stft does): equal to transformers' `WhisperFeatureExtractor`
numpy path (float64) within ~7e-6 and to its torch path within ~2e-5 (tests/unit/test_mel.py);
faster than faster-whisper's extractor (benchmarks/results/mel_speed.md).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from app.engine.side_threads import beside
from app.runtime.contract import N_FRAMES, SAMPLE_RATE

N_FFT = 400  # samples per STFT window (25 ms)
HOP_LENGTH = 160  # samples per mel frame (10 ms)
FRAMES_PER_SECOND = SAMPLE_RATE // HOP_LENGTH  # 100
_BLOCK_FRAMES = 4096  # STFT frames transformed at a time (bounds memory for long audio)
SPLIT_FRAMES = 1000  # from this many frames (10 s) the second half goes to a side thread


def _hz_to_mel(freqs: np.ndarray) -> np.ndarray:
    """Slaney mel scale (librosa `hz_to_mel(htk=False)`): linear below 1 kHz, log above."""
    f_sp = 200.0 / 3
    min_log_hz = 1000.0
    min_log_mel = min_log_hz / f_sp
    logstep = np.log(6.4) / 27.0
    freqs = np.asarray(freqs, dtype=np.float64)
    log_part = min_log_mel + np.log(np.maximum(freqs, min_log_hz) / min_log_hz) / logstep
    return np.where(freqs >= min_log_hz, log_part, freqs / f_sp)


def _mel_to_hz(mels: np.ndarray) -> np.ndarray:
    f_sp = 200.0 / 3
    min_log_hz = 1000.0
    min_log_mel = min_log_hz / f_sp
    logstep = np.log(6.4) / 27.0
    mels = np.asarray(mels, dtype=np.float64)
    log_part = min_log_hz * np.exp(logstep * (mels - min_log_mel))
    return np.where(mels >= min_log_mel, log_part, f_sp * mels)


@lru_cache(maxsize=4)
def mel_filters(n_mels: int) -> np.ndarray:
    """Mel filterbank f32 [n_mels, 201] for 16 kHz, n_fft 400, 0-8 kHz, Slaney scale and norm.

    The same matrix as `librosa.filters.mel(sr=16000, n_fft=400, n_mels=n_mels)` (what
    openai/whisper ships in mel_filters.npz), computed here without importing librosa, whose
    import alone takes over a second. The returned array is read-only (it is cached).
    """
    if n_mels <= 0:
        raise ValueError(f"n_mels must be positive, got {n_mels}")
    fft_freqs = np.fft.rfftfreq(N_FFT, d=1.0 / SAMPLE_RATE)  # [201] Hz
    mel_freqs = _mel_to_hz(
        np.linspace(_hz_to_mel(0.0), _hz_to_mel(SAMPLE_RATE / 2), n_mels + 2)
    )  # [n_mels + 2] Hz: band edges
    fdiff = np.diff(mel_freqs)
    ramps = np.subtract.outer(mel_freqs, fft_freqs)  # [n_mels + 2, 201]
    lower = -ramps[:-2] / fdiff[:-1, None]
    upper = ramps[2:] / fdiff[1:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    weights *= (2.0 / (mel_freqs[2:] - mel_freqs[:-2]))[:, None]  # Slaney area normalisation
    weights = weights.astype(np.float32)
    weights.flags.writeable = False
    return weights


@lru_cache(maxsize=1)
def _hann_window() -> np.ndarray:
    """Periodic Hann window f32 [400], as `torch.hann_window(400)`."""
    return (0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(N_FFT) / N_FFT)).astype(np.float32)


def _frames_reaching_audio(n_samples: int, n_frames: int) -> int:
    """How many leading frames see a sample of the audio; the rest see only appended zeros.

    Frame f covers samples [f * 160 - 200, f * 160 + 200). With more than 200 zeros appended, the
    end's reflect padding mirrors zeros too, so every later frame is silence: its power is exactly
    0 and its log-mel the clamp value, with no transform needed (the 30 s of padding a file gets
    would otherwise be a third of a 60 s clip's work). With fewer, no frame lies past the audio."""
    return min(n_frames, -(-(n_samples + N_FFT // 2) // HOP_LENGTH))


def log_mel_spectrogram(audio: np.ndarray, n_mels: int = 80, padding: int = 0) -> np.ndarray:
    """Whisper log-mel features of 16 kHz mono audio.

    audio: f32 [N] samples; `padding` zero samples are appended first.
    Returns f32 [n_mels, (N + padding) // 160]: frame f is centred on sample f * 160.
    Steps (openai/whisper `log_mel_spectrogram`): STFT with n_fft 400, hop 160, periodic Hann
    window, reflect padding of 200 samples at both ends (torch.stft center=True), last frame
    dropped; power spectrum; mel filterbank; log10 clamped at 1e-10; floor at (max - 8);
    then (x + 4) / 4. All in float32 (as torch.stft computes it), in blocks of frames; log10 is
    taken as ln(x) / ln(10), numpy's vectorised float32 log being several times faster.
    """
    audio = np.asarray(audio, dtype=np.float32)
    if audio.ndim != 1:
        raise ValueError(f"audio must be 1-D [N] samples, got shape {audio.shape}")
    if padding < 0:
        raise ValueError(f"padding must be >= 0, got {padding}")
    n_frames = (audio.shape[0] + padding) // HOP_LENGTH
    out = np.empty((n_mels, n_frames), dtype=np.float32)
    if n_frames == 0:
        return out
    n_computed = _frames_reaching_audio(audio.shape[0], n_frames)
    # enough of the appended zeros for the computed frames' windows and the end's reflection
    tail = min(padding, (n_computed - 1) * HOP_LENGTH + N_FFT - audio.shape[0])
    padded = np.pad(np.pad(audio, (0, max(tail, 0))), N_FFT // 2, mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP_LENGTH]
    # frames are independent: a long clip's second half is transformed on a side thread
    half = n_computed // 2 if n_computed >= SPLIT_FRAMES else n_computed
    second = beside(_mel_power, frames, out, half, n_computed) if half < n_computed else None
    _mel_power(frames, out, 0, half)
    if second is not None:
        second()
    out[:, n_computed:] = 0.0  # silence: no power
    np.maximum(out, 1e-10, out=out)
    np.log(out, out=out)
    out *= np.float32(1.0 / np.log(10.0))
    np.maximum(out, out.max() - 8.0, out=out)
    out += 4.0
    out /= 4.0
    return out


def _mel_power(frames: np.ndarray, out: np.ndarray, start: int, stop: int) -> None:
    """The mel power of `frames[start:stop]` (f32 [n, 400] views of the padded audio) into
    `out[:, start:stop]`, in blocks of `_BLOCK_FRAMES`."""
    filters_t = mel_filters(out.shape[0]).T  # [201, n_mels]
    window = _hann_window()
    for first in range(start, stop, _BLOCK_FRAMES):
        last = min(first + _BLOCK_FRAMES, stop)
        spectrum = np.fft.rfft(frames[first:last] * window, axis=-1)  # [b, 201] complex64
        power = np.abs(spectrum)
        np.square(power, out=power)
        out[:, first:last] = (power @ filters_t).T  # [n_mels, b]


def pad_or_trim(array: np.ndarray, length: int = N_FRAMES, *, axis: int = -1) -> np.ndarray:
    """Cut `array` to `length` along `axis`, or pad it with zeros at the end to that length.

    For mel features [n_mels, frames] the default gives one 30 s encoder window [n_mels, 3000].
    Trimming returns a view; the input itself comes back when it already has that length.
    """
    size = array.shape[axis]
    if size > length:
        index = [slice(None)] * array.ndim
        index[axis] = slice(0, length)
        return array[tuple(index)]  # a view
    if size < length:
        widths = [(0, 0)] * array.ndim
        widths[axis] = (0, length - size)
        return np.pad(array, widths)
    return array
