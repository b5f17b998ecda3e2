"""When a window's decoding attempt is retried at the next temperature, and which attempt
stands when all fail: openai/whisper's `transcribe.py` rule, as data (`FallbackRule`).

- too repetitive: the repetition guard cut the decode off (`looped`), or the text's zlib
  compression ratio is above `compression_ratio_threshold` (2.4);
- too unlikely: the average log-prob is below `log_prob_threshold` (-1);
- but probably silent (no-speech probability above `no_speech_threshold`, 0.6) and unlikely:
  no retry, the caller skips the window.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.engine.decoding_types import DecodingResult
from app.service.transcription.options import TranscriptionOptions


@dataclass(frozen=True)
class FallbackRule:
    """The thresholds (None: that test is off)."""

    compression_ratio_threshold: float | None = 2.4
    log_prob_threshold: float | None = -1.0
    no_speech_threshold: float | None = 0.6

    @classmethod
    def of(cls, options: TranscriptionOptions) -> FallbackRule:
        return cls(
            options.compression_ratio_threshold,
            options.log_prob_threshold,
            options.no_speech_threshold,
        )

    def maybe_silent(self, no_speech_prob: float) -> bool:
        """The window may be skipped as silence (then its text is held back while decoding)."""
        return (
            self.no_speech_threshold is not None
            and self.log_prob_threshold is not None
            and no_speech_prob > self.no_speech_threshold
        )

    def too_repetitive(self, result: DecodingResult) -> bool:
        cr = self.compression_ratio_threshold
        return result.looped or (cr is not None and result.compression_ratio > cr)

    def retry(self, result: DecodingResult) -> bool:
        """Decode the window again at the next temperature."""
        lp = self.log_prob_threshold
        unlikely = lp is not None and result.avg_logprob < lp
        if unlikely and self.maybe_silent(result.no_speech_prob):
            return False  # silence: the caller skips the window
        return unlikely or self.too_repetitive(result)

    def best(self, results: Sequence[DecodingResult]) -> DecodingResult:
        """Every temperature failed: the likeliest result that is not repetitive (faster-whisper),
        but never one the repetition guard cut off. A looped result is not text but a loop whose
        lone closing timestamp would make the caller skip the rest of the window: taken once
        when all six attempts of a window failed, it dropped 29 s of speech from the 10 min
        benchmark clip (a sentence said three times over: every attempt compressed above 2.4,
        and the likeliest of them was a loop sampled at T=0.6)."""
        below_cr = [r for r in results if not self.too_repetitive(r)]
        unlooped = [r for r in results if not r.looped]
        return max(below_cr or unlooped or results, key=lambda r: r.avg_logprob)
