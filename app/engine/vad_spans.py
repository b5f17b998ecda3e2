"""Speech regions of a whole clip from Silero VAD's probabilities (the REST `vad_filter`
option): `speech_timestamps` / `spans_from_probs` (silero-vad's `get_speech_timestamps` rules),
the speech collected into one clip (`collect_speech`) and the map that puts the collected clip's
times back on the original's (`speech_time_map`, `restore_time`). Times in samples at 16 kHz
unless a name says seconds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from app.engine.vad import CHUNK_SAMPLES, SileroVad, VadOptions
from app.runtime.contract import SAMPLE_RATE


@dataclass(frozen=True)
class SpeechSpan:
    """One speech region [start, end) in samples at 16 kHz."""

    start: int
    end: int

    @property
    def start_s(self) -> float:
        return self.start / SAMPLE_RATE

    @property
    def end_s(self) -> float:
        return self.end / SAMPLE_RATE


def spans_from_probs(
    probs: Iterable[float], n_samples: int, options: VadOptions | None = None
) -> list[SpeechSpan]:
    """Speech regions from per-chunk probabilities (silero-vad's `get_speech_timestamps` rules).

    Hysteresis as in `VadStream`; regions shorter than `min_speech_s` are dropped; a region
    longer than `max_speech_s` is split at its longest inner pause (or cut hard when it has
    none); each region is padded by `speech_pad_s` (halving the gap when two pads would meet).
    """
    opts = options or VadOptions()
    min_speech = opts.min_speech_s * SAMPLE_RATE
    min_silence = opts.min_silence_s * SAMPLE_RATE
    max_speech = opts.max_speech_s * SAMPLE_RATE
    pad = round(opts.speech_pad_s * SAMPLE_RATE)

    raw: list[list[int]] = []
    start: int | None = None
    silence_start: int | None = None
    pauses: list[tuple[int, int]] = []  # (start, length) of inner pauses of the open region
    for i, prob in enumerate(probs):
        pos = i * CHUNK_SAMPLES
        if prob >= opts.threshold:
            if silence_start is not None:
                pauses.append((silence_start, pos - silence_start))
                silence_start = None
            if start is None:
                start = pos
            elif pos - start > max_speech:
                if pauses:
                    cut, length = max(pauses, key=lambda p: p[1])
                    raw.append([start, cut])
                    start = cut + length
                else:
                    raw.append([start, pos])
                    start = pos
                pauses = [p for p in pauses if p[0] >= start]
            continue
        if start is not None and prob < opts.exit_threshold:
            if silence_start is None:
                silence_start = pos
            if pos + CHUNK_SAMPLES - silence_start >= min_silence:
                raw.append([start, silence_start])
                start, silence_start, pauses = None, None, []
    if start is not None:
        raw.append([start, silence_start if silence_start is not None else n_samples])

    kept = [r for r in raw if r[1] - r[0] >= min_speech]
    for i, region in enumerate(kept):
        if i == 0:
            region[0] = max(0, region[0] - pad)
        if i + 1 < len(kept):
            gap = kept[i + 1][0] - region[1]
            if gap < 2 * pad:
                region[1] += gap // 2
                kept[i + 1][0] -= gap - gap // 2
            else:
                region[1] = min(n_samples, region[1] + pad)
                kept[i + 1][0] = max(0, kept[i + 1][0] - pad)
        else:
            region[1] = min(n_samples, region[1] + pad)
    return [SpeechSpan(int(a), int(b)) for a, b in kept if b > a]


def speech_timestamps(
    vad: SileroVad, audio: np.ndarray, options: VadOptions | None = None
) -> list[SpeechSpan]:
    """Speech regions of f32 [N] 16 kHz audio (samples), for the REST `vad_filter` option."""
    audio = np.asarray(audio, dtype=np.float32).reshape(-1)
    if audio.shape[0] == 0:
        return []
    return spans_from_probs(vad.probs(audio), audio.shape[0], options)


def collect_speech(audio: np.ndarray, spans: list[SpeechSpan]) -> np.ndarray:
    """The speech regions of f32 [N] audio concatenated -> f32 [M] (M = total span length)."""
    if not spans:
        return np.zeros(0, np.float32)
    return np.concatenate([audio[s.start : s.end] for s in spans]).astype(np.float32, copy=False)


def speech_time_map(spans: list[SpeechSpan]) -> list[tuple[float, float]]:
    """(time in the collected audio, time in the original audio) pairs (seconds) at each span's
    start, to map segment times of `collect_speech` output back: t_orig = t + (orig - coll) of
    the last pair with coll <= t."""
    pairs: list[tuple[float, float]] = []
    collected = 0
    for s in spans:
        pairs.append((collected / SAMPLE_RATE, s.start / SAMPLE_RATE))
        collected += s.end - s.start
    return pairs


def restore_time(t: float, time_map: list[tuple[float, float]], *, end: bool = False) -> float:
    """A time (seconds) in the collected speech -> the time in the original audio. An `end`
    falling exactly where two speech regions were joined belongs to the earlier one."""
    offset = 0.0
    for collected, original in time_map:
        if collected > t or (end and collected == t and t > 0):
            break
        offset = original - collected
    return t + offset
