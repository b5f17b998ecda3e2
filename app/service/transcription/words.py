"""Word timestamps for the segments of one window (`TranscriptionOptions.word_timestamps`).

The engine aligns the window's text tokens (`app.engine.timing`); `segment_words` gives each of
the window's segments its words (files and live passes), and `add_words` hands them to a file
window's `Segment`s, whose bounds then follow their words (a word never crosses its segment).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from app.engine.timing import align_words, assign_words, frame_levels, group_words
from app.engine.tokenizer import Tokenizer
from app.runtime.steps import Steps
from app.service.transcription.results import Segment, Word


@dataclass(frozen=True)
class WindowAudio:
    """What word timing needs of one decoded window.

    cross: its cross K/V, each [1, H, 1500, Dh]; features: its log-mel [n_mels, frames] (the
    audio only, no padding); time_offset: its start (s).
    """

    cross: list[np.ndarray]
    features: np.ndarray
    time_offset: float
    sot_sequence: tuple[int, ...]
    language: str | None


def segment_words(
    tokenizer: Tokenizer,
    window: WindowAudio,
    segments: Sequence[Sequence[int]],
) -> Steps[list[list[Word]]]:
    """The text tokens of a window's segments (`segments`: each one's tokens, timestamps
    ignored) aligned to its audio: each segment's words, seconds from the window's start."""
    eot = tokenizer.eot
    text = [[t for t in tokens if t < eot] for tokens in segments]
    words = yield from align_words(
        window.cross,
        tokenizer,
        window.sot_sequence,
        window.language,
        [t for tokens in text for t in tokens],
        n_frames=window.features.shape[-1] // 2,
    )
    return group_words(words, [len(tokens) for tokens in text])


def add_words(
    segments: list[Segment],
    tokenizer: Tokenizer,
    window: WindowAudio,
    last_speech: float,
) -> Steps[tuple[list[Segment], float]]:
    """A file window's `segments`, each with its words; and the end of the last speech, for the
    next window. A segment's first word starts where its sound does (the window's levels)."""
    groups = yield from segment_words(tokenizer, window, [s.tokens for s in segments])
    placed, last_speech = assign_words(
        groups, [(s.start, s.end) for s in segments], window.time_offset, last_speech,
        frame_levels(window.features),
    )  # fmt: skip
    out = [
        replace(
            segment,
            start=round(start, 2),  # as its words' (rounding keeps them inside)
            end=round(end, 2),
            words=tuple(
                Word(
                    round(w.start, 2),
                    round(w.end, 2),
                    w.word,
                    round(w.probability or 0.0, 4),
                    w.tokens,
                    tuple(round(p, 6) for p in w.logprobs),
                )
                for w in words
            ),
        )
        for segment, (start, end, words) in zip(segments, placed, strict=True)
    ]
    return out, last_speech
