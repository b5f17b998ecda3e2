"""Word timestamps for the segments of one window (`TranscriptionOptions.word_timestamps`).

The engine aligns the window's text tokens (`app.engine.timing`); this hands the words to the
window's `Segment`s, whose bounds then follow their words (a word never crosses its segment).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from app.engine.backend import WhisperBackend
from app.engine.timing import (
    SegmentWords,
    WordTiming,
    align_words,
    assign_words,
    frame_levels,
)
from app.engine.tokenizer import Tokenizer
from app.service.results import Segment, Word


@dataclass(frozen=True)
class WindowAudio:
    """What word timing needs of one decoded window.

    cross: its cross K/V, each [1, H, 1500, Dh]; features: its log-mel [n_mels, frames] (the
    audio only, no padding); time_offset: its start (s); pad_to: fixed aligner rows (static).
    """

    cross: list[np.ndarray]
    features: np.ndarray
    time_offset: float
    sot_sequence: tuple[int, ...]
    language: str | None
    pad_to: int | None = None


def window_words(
    backend: WhisperBackend, tokenizer: Tokenizer, window: WindowAudio, text_tokens: list[int]
) -> list[WordTiming]:
    """The window's text tokens aligned to its audio (seconds from the window's start)."""
    return align_words(
        backend,
        window.cross,
        tokenizer,
        window.sot_sequence,
        window.language,
        text_tokens,
        n_frames=window.features.shape[-1] // 2,
        pad_to=window.pad_to,
    )


def add_words(
    segments: list[Segment],
    backend: WhisperBackend,
    tokenizer: Tokenizer,
    window: WindowAudio,
    last_speech: float,
) -> tuple[list[Segment], float]:
    """The window's `segments`, each with its words; and the end of the last speech, for the
    next window. A segment's first word starts where its sound does (the window's levels)."""
    eot = tokenizer.eot
    holders = [SegmentWords(s.start, s.end, [t for t in s.tokens if t < eot]) for s in segments]
    text_tokens = [t for h in holders for t in h.text_tokens]
    timings = window_words(backend, tokenizer, window, text_tokens)
    levels = frame_levels(window.features)
    last_speech = assign_words(timings, holders, window.time_offset, last_speech, levels)
    out = [
        replace(
            segment,
            start=round(holder.start, 2),  # as its words' (rounding keeps them inside)
            end=round(holder.end, 2),
            words=tuple(
                Word(
                    round(w.start, 2),
                    round(w.end, 2),
                    w.word,
                    round(w.probability, 4),
                    tuple(w.tokens),
                    tuple(round(p, 6) for p in w.logprobs),
                )
                for w in holder.words
            ),
        )
        for segment, holder in zip(segments, holders, strict=True)
    ]
    return out, last_speech
