"""Word timestamps for the segments of one window (`TranscriptionOptions.word_timestamps`).

The engine aligns the window's text tokens (`app.engine.timing`); this hands the words to the
window's `Segment`s, whose bounds then follow their words (a word never crosses its segment).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from app.engine.backend import WhisperBackend
from app.engine.timing import SegmentWords, align_words, assign_words, frame_levels
from app.engine.tokenizer import Tokenizer
from app.service.results import Segment, Word


def add_words(
    segments: list[Segment],
    backend: WhisperBackend,
    cross: list[np.ndarray],
    tokenizer: Tokenizer,
    sot_sequence: tuple[int, ...],
    language: str | None,
    *,
    window_frames: int,
    time_offset: float,
    last_speech: float,
    pad_to: int | None = None,
    features: np.ndarray | None = None,
) -> tuple[list[Segment], float]:
    """`segments` of the window at `time_offset` (s) with `window_frames` mel frames of audio,
    each with its words; and the end of the last speech, for the next window. features: the
    window's log-mel [n_mels, frames], to start words where the sound does."""
    eot = tokenizer.eot
    holders = [SegmentWords(s.start, s.end, [t for t in s.tokens if t < eot]) for s in segments]
    text_tokens = [t for h in holders for t in h.text_tokens]
    timings = align_words(
        backend,
        cross,
        tokenizer,
        sot_sequence,
        language,
        text_tokens,
        n_frames=window_frames // 2,
        pad_to=pad_to,
    )
    levels = frame_levels(features) if features is not None else None
    last_speech = assign_words(timings, holders, time_offset, last_speech, levels)
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
