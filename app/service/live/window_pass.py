"""One live pass: the buffer's audio through the window pipeline, as timed words.

The same steps as a file's window (`app.service.windows.encode_window`, `app.service.words`):
log-mel of the audio (1 s of zeros after it gives the frames the file path gets from its
appended 30 s), one encoder call, greedy decoding with timestamps after the forced prefix of
committed segments, then — when the session needs them — the alignment heads' attention for word
times and AlignAtt's peaks. A pass judged silent (Whisper's no-speech probability with a low
average log-prob or a text too long for its audio, and nothing forced:
`app.service.windows.judged_silent`) or caught in a repetition loop gives no words.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from app.engine.audio import lift_quiet
from app.engine.decoding import DecodingTask
from app.engine.decoding_types import DecodingCancelled, DecodingOptions, DecodingResult
from app.engine.mel import HOP_LENGTH, log_mel_spectrogram
from app.engine.timing import TextClock, frame_levels, group_words, start_at_speech
from app.engine.tokenizer import Tokenizer
from app.runtime.contract import N_FRAMES, N_SAMPLES_PER_WINDOW, SAMPLE_RATE
from app.service.live.options import StreamingOptions
from app.service.live.units import LiveWord, PassSegment, split_segments, split_units, word_key
from app.service.transcriber import Transcriber, TranscriptionCancelled
from app.service.windows import encode_window, judged_silent
from app.service.words import WindowAudio, window_words

log = logging.getLogger(__name__)


@dataclass
class Pass:
    """What one pass decoded: words (stream seconds) and segments (seconds from `start`)."""

    words: list[LiveWord]
    segments: list[PassSegment]
    start: int  # absolute sample of the decoded audio's start
    end: int
    result: DecodingResult | None  # None: the audio held no speech

    @property
    def usable(self) -> bool:
        return self.result is not None and not self.result.looped

    @property
    def seconds(self) -> float:
        return (self.end - self.start) / SAMPLE_RATE


@dataclass(frozen=True)
class PassRequest:
    """audio: f32 [<= 30 s] starting at absolute sample `start`; prompt: conditioning tokens;
    prefix: forced tokens (committed segments with their timestamps), not decoded again."""

    audio: np.ndarray
    start: int
    prompt: tuple[int, ...] = ()
    prefix: tuple[int, ...] = ()


class PassRunner:
    """Runs the passes of one session (`language` is fixed by the first one when detected)."""

    def __init__(self, transcriber: Transcriber, options: StreamingOptions) -> None:
        self.transcriber = transcriber
        self.tokenizer = transcriber.tokenizer
        self.options = options
        self.language = options.language or (None if transcriber.multilingual else "en")

    def run(
        self,
        request: PassRequest,
        on_token: Callable[[int], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> Pass:
        audio = request.audio[:N_SAMPLES_PER_WINDOW]
        start, end = request.start, request.start + audio.shape[0]
        sessions, tok, prefix = self.transcriber.sessions, self.tokenizer, request.prefix
        mel = log_mel_spectrogram(lift_quiet(audio), self.transcriber.n_mels, padding=SAMPLE_RATE)
        content = min(audio.shape[0] // HOP_LENGTH, N_FRAMES)
        features = mel[:, :content]
        if cancel is not None and cancel.is_set():
            raise TranscriptionCancelled("stream closed")
        cross = encode_window(sessions, features)  # [1, H, 1500, Dh] each
        options = DecodingOptions(
            task=self.options.task,
            language=self.language,
            temperature=0.0,
            prompt=request.prompt or None,
            prefix=prefix or None,
            max_initial_timestamp=None if prefix else 1.0,
            kv_cache=self.options.kv_cache,
        )
        task = DecodingTask(sessions, cross, tok, options)
        if self.language is None:
            self.language = task.language
            log.info("stream language detected: %s", self.language)
        try:
            result = task.run(on_token, cancel)
        except DecodingCancelled as e:
            raise TranscriptionCancelled(str(e)) from e
        duration = audio.shape[0] / SAMPLE_RATE
        silent = not prefix and judged_silent(
            result.no_speech_prob,
            result.avg_logprob,
            result.text,
            duration,
            self.options.no_speech_threshold,
            self.options.log_prob_threshold,
        )
        if silent or result.looped:
            log.debug(
                "pass over %.2f s dropped: %s (no-speech %.2f, avg logprob %.2f)",
                duration, "looped" if result.looped else "no speech",
                result.no_speech_prob, result.avg_logprob,
            )  # fmt: skip
            return Pass([], [], start, end, None if silent else result)
        segments = split_segments((*prefix, *result.tokens), tok.timestamp_begin, duration)
        clock = None
        if self.options.aligned:
            window = WindowAudio(
                cross, features, 0.0, tuple(tok.sot_sequence(self.language, self.options.task)),
                self.language,
            )  # fmt: skip
            timed = window_words(sessions, tok, window, [t for s in segments for t in s.tokens])
            groups = group_words(timed, [len(s.tokens) for s in segments])
            start_at_speech([group[0] for group in groups if group], frame_levels(features))
            clock = TextClock(timed)
        words = pass_words(tok, segments, start / SAMPLE_RATE, clock)
        log.debug(
            "pass over %.2f s: prefix %d tokens, %d new, %d segments, %d words",
            duration, len(prefix), len(result.tokens), len(segments), len(words),
        )  # fmt: skip
        return Pass(words, segments, start, end, result)


def pass_words(
    tokenizer: Tokenizer, segments: list[PassSegment], offset_s: float, clock: TextClock | None
) -> list[LiveWord]:
    """Words of every segment (`offset_s`: stream seconds of the pass's start), timed by
    `clock` (measured, over the segments' joined text) or else spread over their segment by
    character count."""
    texts = [tokenizer.decode(seg.tokens) for seg in segments]
    if clock is not None and clock.text != "".join(texts):
        log.warning("aligned words do not spell the pass's text; word times estimated")
        clock = None
    words: list[LiveWord] = []
    char = 0  # where this segment's text starts in the joined text
    for index, (seg, text) in enumerate(zip(segments, texts, strict=True)):
        units = split_units(text)
        total = sum(len(u.strip()) for u in units) or 1
        span = seg.end - seg.start
        done = 0
        at = 0  # where the unit is in this segment's text
        for unit in units:
            size = len(unit.strip())
            at = text.index(unit, at)
            peak = probability = None
            if clock is not None:
                first = char + at + len(unit) - len(unit.lstrip())
                last = char + at + len(unit.rstrip()) - 1
                begin, finish = clock.span(first, last)
                begin, finish = offset_s + begin, offset_s + finish
                peak = offset_s + clock.peak(first, last)
                probability = clock.probability(first, last)
            else:
                begin = offset_s + seg.start + span * done / total
                finish = offset_s + seg.start + span * (done + size) / total
            done += size
            at += len(unit)
            words.append(LiveWord(unit, word_key(unit), begin, finish, index, peak, probability))
        char += len(text)
    return words
