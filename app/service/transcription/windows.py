"""One window's tokens -> segments (files and live passes) and a file's next seek; segment
times mapped back through the VAD's collecting."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np

from app.engine.mel import pad_or_trim
from app.engine.vad_spans import restore_time
from app.runtime.contract import N_FRAMES, TIME_PRECISION
from app.runtime.steps import EncoderInputs, Steps
from app.service.transcription.results import Segment

INPUT_STRIDE = N_FRAMES // 1500  # mel frames per timestamp step (2)
MAX_CHARS_PER_S = 30.0  # faster than anyone speaks (fast speech: ~20 characters a second)


def judged_silent(
    no_speech_prob: float,
    avg_logprob: float,
    text: str,
    audio_s: float,
    no_speech_threshold: float | None,
    log_prob_threshold: float | None,
) -> bool:
    """Whether a decoded window held no speech, and its text is to be dropped.

    Whisper's rule: its no-speech probability is above `no_speech_threshold` and the text's
    average log-prob is below `log_prob_threshold` (a confident text overrides the no-speech
    token). One more tie-breaker: a text longer than anyone could say in the window's audio
    (`MAX_CHARS_PER_S`) is not confident speech whatever its log-prob — it is the prompt or
    earlier text written again over a short stretch of noise (base wrote "The results are pretty
    good as you can see." over the last 0.28 s of a noisy clip: no-speech 0.92, log-prob -0.82).
    """
    if no_speech_threshold is None or no_speech_prob <= no_speech_threshold:
        return False
    if len(text.strip()) > MAX_CHARS_PER_S * max(audio_s, 0.0):
        return True
    return log_prob_threshold is None or avg_logprob <= log_prob_threshold


def encode_window(features: np.ndarray) -> Steps[list[np.ndarray]]:
    """A window's log-mel [n_mels, <= 3000] (padded here to 3000 frames) -> its cross K/V,
    each [1, H, 1500, Dh] (one encoder call)."""
    window = pad_or_trim(features, N_FRAMES)  # [n_mels, 3000]
    return (yield EncoderInputs(np.ascontiguousarray(window[None])))


def restore_times(
    segments: Iterator[Segment], time_map: list[tuple[float, float]], duration: float
) -> Iterator[Segment]:
    """Segment times of the VAD-collected speech -> times in the original audio (seconds)."""

    def span(start: float, end: float) -> tuple[float, float]:
        start = restore_time(start, time_map)
        return start, min(max(restore_time(end, time_map, end=True), start), duration)

    for segment in segments:
        start, end = span(segment.start, segment.end)
        words = segment.words
        if words is not None:
            words = tuple(
                replace(w, start=round(s, 3), end=round(e, 3))  # rounded as the segment
                for w in words
                for s, e in [span(w.start, w.end)]
            )
        yield replace(segment, start=round(start, 3), end=round(end, 3), words=words)


@dataclass(frozen=True)
class WindowSegment:
    """A stretch of one window's text between timestamp tokens (seconds from the window's
    start, within its audio).

    tokens: its text tokens; closed: ended by a timestamp token (else the decoder stopped
    inside it); decoded: its tokens as decoded, with the timestamp tokens around it (a file
    segment reports these).
    """

    start: float
    end: float
    tokens: tuple[int, ...]
    closed: bool = True
    decoded: tuple[int, ...] = ()

    def shifted(self, seconds: float) -> WindowSegment:
        return replace(self, start=self.start - seconds, end=self.end - seconds)


def split_window(
    tokens: Sequence[int], timestamp_begin: int, duration: float
) -> list[WindowSegment]:
    """Cut one window's tokens into segments at timestamp tokens; keep the unfinished tail.

    `<|a|> text <|b|><|b|> text <|c|>` -> [a, b) and [b, c); text after the last timestamp is an
    open segment ending at `duration` (seconds of audio in the window); a timestamp past it
    counts as `duration`.
    """
    segments: list[WindowSegment] = []
    start: float | None = None
    opened = 0  # where the segment's tokens begin (its opening timestamp)
    text: list[int] = []
    for i, t in enumerate(tokens):
        if t >= timestamp_begin:
            ts = min((t - timestamp_begin) * TIME_PRECISION, duration)
            if text:
                begin = start if start is not None else 0.0
                decoded = tuple(tokens[opened : i + 1])
                segments.append(WindowSegment(begin, max(ts, begin), tuple(text), True, decoded))
                text = []
            start, opened = ts, i
        else:
            text.append(t)
    if text:
        begin = start if start is not None else 0.0
        decoded = tuple(tokens[opened:])
        segments.append(WindowSegment(begin, max(duration, begin), tuple(text), False, decoded))
    return segments


def file_segments(
    tokens: Sequence[int], timestamp_begin: int, segment_size: int, duration: float
) -> tuple[list[WindowSegment], int]:
    """A file window's segments (openai/whisper's rule) and how far to seek (mel frames).

    Consecutive timestamp tokens close a segment and open the next. When the tokens end in a
    single timestamp, the last segment is closed and the whole window is consumed; otherwise the
    unfinished tail after the last pair is dropped and the seek stops at that pair. Tokens with
    no pair form one segment from the window's start up to the last timestamp (or the window's
    end).
    """
    tokens = list(tokens)
    is_ts = [t >= timestamp_begin for t in tokens]
    pairs = [i + 1 for i in range(len(tokens) - 1) if is_ts[i] and is_ts[i + 1]]
    if pairs:
        if is_ts[-2:] == [False, True]:  # a single timestamp ending: no speech after it
            seek_delta = segment_size
        else:
            seek_delta = (tokens[pairs[-1] - 1] - timestamp_begin) * INPUT_STRIDE
        closed = [s for s in split_window(tokens, timestamp_begin, duration) if s.closed]
        return closed, max(seek_delta, 1)
    end = duration
    timestamps = [t for t in tokens if t >= timestamp_begin]
    if timestamps and timestamps[-1] != timestamp_begin:
        end = (timestamps[-1] - timestamp_begin) * TIME_PRECISION
    if not tokens:
        return [], segment_size
    text = tuple(t for t in tokens if t < timestamp_begin)
    return [WindowSegment(0.0, end, text, True, tuple(tokens))], segment_size
