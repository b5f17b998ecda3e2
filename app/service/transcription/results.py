"""Typed transcription results: `Segment` (with its `Word`s, the engine's one word type),
`TranscriptionInfo` and the timing stats.

Times are seconds from the start of the audio.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from app.engine.words import Word

if TYPE_CHECKING:
    from app.engine.decoding_types import DecodingResult


@dataclass(frozen=True)
class Segment:
    """A piece of the transcript between two timestamps (seconds).

    tokens: the segment's tokens, timestamp tokens included; words: its `Word`s (times rounded
    to 10 ms, no `peak`) when word timestamps were asked for.
    seek: mel frame (10 ms) where the window that produced it started.
    """

    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: tuple[int, ...]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    words: tuple[Word, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (OpenAI verbose_json segment shape)."""
        data: dict[str, Any] = {
            "id": self.id,
            "seek": self.seek,
            "start": round(self.start, 3),
            "end": round(self.end, 3),
            "text": self.text,
            "tokens": list(self.tokens),
            "temperature": self.temperature,
            "avg_logprob": self.avg_logprob,
            "compression_ratio": self.compression_ratio,
            "no_speech_prob": self.no_speech_prob,
        }
        if self.words is not None:
            data["words"] = [
                {"word": w.word, "start": w.start, "end": w.end, "probability": w.probability}
                for w in self.words
            ]
        return data


@dataclass
class TranscriptionStats:
    """Per-stage timings of one transcription (seconds), filled in as segments are produced:
    complete once the segment iterator is exhausted.

    steps: decoder loop iterations (one token per row); prefill_s and decoder_s sum the decoder
    calls of the prefix and of the steps; tokens: text + timestamp tokens kept in segments.
    """

    audio_s: float = 0.0
    vad_s: float = 0.0
    mel_s: float = 0.0
    encoder_s: float = 0.0
    language_s: float = 0.0
    prefill_s: float = 0.0
    decoder_s: float = 0.0
    search_s: float = 0.0  # decode() wall time minus decoder calls: filters, selection, copies
    align_s: float = 0.0  # word timing: aligner calls and DTW
    windows: int = 0
    attempts: int = 0
    fallbacks: int = 0
    prefills: int = 0  # prompt prefills computed (fallback attempts reuse their window's)
    steps: int = 0
    decoder_calls: int = 0
    tokens: int = 0
    cache_nbytes: int = 0  # peak K/V bytes (cross + self) of one decode
    handed_nbytes: int = 0  # input bytes given to the runtime by the decoder's step calls
    total_s: float = 0.0

    def add_attempt(self, result: DecodingResult, *, fallback: bool) -> None:
        """Count one decoding attempt of a window (`fallback`: at a temperature after the
        first) and its decoder timings."""
        self.attempts += 1
        self.fallbacks += int(fallback)
        s = result.stats
        if s is None:
            return
        self.prefill_s += s.prefill_s
        self.prefills += int(not s.prefill_reused)
        self.decoder_s += s.decoder_s
        self.search_s += max(0.0, s.wall_s - s.decoder_s)
        self.steps += s.steps
        self.decoder_calls += s.calls
        self.handed_nbytes += s.handed_nbytes
        self.cache_nbytes = max(self.cache_nbytes, s.cache_nbytes)

    def summary(self) -> str:
        """One log line: where the time went."""
        return (
            f"transcribed {self.audio_s:.2f} s in {self.total_s:.3f} s (RTF {self.rtf:.3f}): "
            f"mel {1e3 * self.mel_s:.1f} ms, encoder {1e3 * self.encoder_s:.1f} ms "
            f"({self.windows} windows), prefill {1e3 * self.prefill_s:.1f} ms, decoder "
            f"{1e3 * self.decoder_s:.1f} ms ({self.steps} steps, {self.ms_per_step:.2f} ms/step, "
            f"{self.tokens_per_s:.1f} tok/s), search {1e3 * self.search_s:.1f} ms, "
            f"{self.attempts} attempts ({self.fallbacks} fallbacks), "
            f"peak K/V {self.cache_nbytes / 1e6:.1f} MB"
        )

    @contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        """Add the wall time of the `with` body to the `stage` field (e.g. "mel_s")."""
        started = time.perf_counter()
        try:
            yield
        finally:
            setattr(self, stage, getattr(self, stage) + time.perf_counter() - started)

    @property
    def ms_per_step(self) -> float:
        return 1000.0 * self.decoder_s / self.steps if self.steps else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.steps / self.decoder_s if self.decoder_s else 0.0

    @property
    def handed_per_call(self) -> float:
        """Mean input bytes given to the runtime per decoder step call."""
        return self.handed_nbytes / self.decoder_calls if self.decoder_calls else 0.0

    @property
    def rtf(self) -> float:
        """Real-time factor: processing time / audio duration."""
        return self.total_s / self.audio_s if self.audio_s else 0.0

    def as_dict(self) -> dict[str, float]:
        return {
            "audio_s": self.audio_s,
            "vad_s": self.vad_s,
            "mel_s": self.mel_s,
            "encoder_s": self.encoder_s,
            "language_s": self.language_s,
            "prefill_s": self.prefill_s,
            "decoder_s": self.decoder_s,
            "search_s": self.search_s,
            "align_s": self.align_s,
            "windows": self.windows,
            "attempts": self.attempts,
            "fallbacks": self.fallbacks,
            "prefills": self.prefills,
            "steps": self.steps,
            "decoder_calls": self.decoder_calls,
            "tokens": self.tokens,
            "ms_per_step": self.ms_per_step,
            "tokens_per_s": self.tokens_per_s,
            "cache_nbytes": self.cache_nbytes,
            "handed_nbytes": self.handed_nbytes,
            "total_s": self.total_s,
            "rtf": self.rtf,
        }


@dataclass(frozen=True)
class TranscriptionInfo:
    """What is known about a transcription before its segments are produced.

    duration: seconds of audio; language_probs: code -> probability (multilingual detection only).
    stats: filled while the segments are generated (see TranscriptionStats).
    """

    language: str
    language_probability: float
    duration: float
    duration_after_vad: float
    options: Any  # TranscriptionOptions (kept untyped here to avoid an import cycle)
    all_language_probs: dict[str, float] | None = None
    stats: TranscriptionStats = field(default_factory=TranscriptionStats, compare=False)


class TimeSpent:
    """The total wall time (seconds) of the `with` bodies it timed, and the last one's."""

    def __init__(self) -> None:
        self.total = 0.0
        self.last = 0.0
        self._started = 0.0

    def __enter__(self) -> TimeSpent:
        self._started = time.perf_counter()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.last = time.perf_counter() - self._started
        self.total += self.last
