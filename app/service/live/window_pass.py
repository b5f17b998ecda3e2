"""One live pass: the buffer's audio through the window pipeline, as timed words.

The same steps as a file's window, through the same `Transcriber` calls: log-mel of the audio
(1 s of zeros after it gives the frames the file path gets from its appended 30 s), one encoder
call, the one window decode (`app.service.transcription.window_decode`) by the pass's plan
(`pass_plan`: one greedy attempt with timestamps after the forced prefix of committed segments),
the cut into `WindowSegment`s (`split_window`), then the words (`Word`): aligned — the alignment
heads' attention for word times and AlignAtt's peaks — when the session needs them, else the one
word split (`split_words`) spread over each segment. A pass judged silent (nothing forced, and
Whisper's no-speech rule or a text too long for its audio) or caught in a repetition loop gives
no words.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from app.engine.decoding_types import DecodingOptions, DecodingResult
from app.engine.mel import HOP_LENGTH
from app.engine.timing import frame_levels, start_at_speech
from app.engine.tokenizer import Tokenizer
from app.engine.words import Word, split_words
from app.runtime.contract import N_FRAMES, N_SAMPLES_PER_WINDOW, SAMPLE_RATE
from app.runtime.steps import Steps
from app.service.live.options import StreamingOptions
from app.service.transcription.fallback import FallbackRule
from app.service.transcription.transcriber import Transcriber, TranscriptionCancelled
from app.service.transcription.window_decode import WindowPlan
from app.service.transcription.windows import WindowSegment, encode_window, split_window
from app.service.transcription.words import WindowAudio, segment_words

log = logging.getLogger(__name__)


@dataclass
class Pass:
    """What one pass decoded: words (stream seconds; `Word.segment` indexes `segments`) and
    segments (seconds from `start`); language: the one its words were split in."""

    words: list[Word]
    segments: list[WindowSegment]
    start: int  # absolute sample of the decoded audio's start
    end: int
    result: DecodingResult | None  # None: the audio held no speech
    language: str | None = None

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
    ) -> Steps[Pass]:
        """The pass of `request` as a resumable task (`app.runtime.steps`)."""
        audio = request.audio[:N_SAMPLES_PER_WINDOW]
        start, end = request.start, request.start + audio.shape[0]
        transcriber, tok, prefix = self.transcriber, self.tokenizer, request.prefix
        mel = transcriber.log_mel(audio, padding=SAMPLE_RATE)
        features = mel[:, : min(audio.shape[0] // HOP_LENGTH, N_FRAMES)]
        if cancel is not None and cancel.is_set():
            raise TranscriptionCancelled("stream closed")
        cross = yield from encode_window(features)  # [1, H, 1500, Dh] each
        duration = audio.shape[0] / SAMPLE_RATE
        if self.language is None and self.options.languages:  # detection among candidates
            detection = yield from transcriber.detect_language(
                cross, self.options.kv_cache, self.options.languages
            )
            self.language = detection.language
            log.info("stream language detected among %s: %s", self.options.languages,
                     self.language)  # fmt: skip
        plan = pass_plan(self.options, self.language, request.prompt, prefix)
        decoded = yield from transcriber.decode_window(
            cross, plan, duration, on_token=on_token, cancel=cancel
        )
        result = decoded.result
        if self.language is None:
            self.language = result.language
            log.info("stream language detected: %s", self.language)
        if decoded.verdict != "speech":
            log.debug(
                "pass over %.2f s dropped: %s (no-speech %.2f, avg logprob %.2f)",
                duration, decoded.verdict, result.no_speech_prob, result.avg_logprob,
            )  # fmt: skip
            kept = None if decoded.verdict == "silent" else result
            return Pass([], [], start, end, kept, self.language)
        segments = split_window((*prefix, *result.tokens), tok.timestamp_begin, duration)
        offset_s = start / SAMPLE_RATE
        if self.options.aligned:
            window = WindowAudio(
                cross, features, 0.0, tuple(tok.sot_sequence(self.language, self.options.task)),
                self.language,
            )  # fmt: skip
            groups = yield from segment_words(tok, window, [s.tokens for s in segments])
            words = aligned_words(groups, frame_levels(features), offset_s)
        else:
            words = spread_words(tok, segments, offset_s, self.language)
        log.debug(
            "pass over %.2f s: prefix %d tokens, %d new, %d segments, %d words",
            duration, len(prefix), len(result.tokens), len(segments), len(words),
        )  # fmt: skip
        return Pass(words, segments, start, end, result, self.language)


def pass_plan(
    options: StreamingOptions,
    language: str | None,
    prompt: tuple[int, ...],
    prefix: tuple[int, ...],
) -> WindowPlan:
    """A pass's plan (`app.service.transcription.window_decode`): one greedy attempt with
    timestamps after the forced `prefix` (its first timestamp free when there is one); judged
    silent only when nothing is forced; a loop is no text; its tokens are partial text, so none
    is held back."""
    attempt = DecodingOptions(
        task=options.task,
        language=language,
        temperature=0.0,
        prompt=prompt or None,
        prefix=prefix or None,
        max_initial_timestamp=None if prefix else 1.0,
        kv_cache=options.kv_cache,
    )
    rule = FallbackRule(None, options.log_prob_threshold, options.no_speech_threshold)
    return WindowPlan((attempt,), rule, judge_silence=not prefix, drop_loops=True,
                      hold_doubtful=False)  # fmt: skip


def aligned_words(groups: list[list[Word]], levels: np.ndarray, offset_s: float) -> list[Word]:
    """A pass's words from each segment's aligned words (seconds from the pass's start): each
    segment's first word starts where its sound does; times in stream seconds (`offset_s`: the
    pass's start)."""
    words: list[Word] = []
    for index, group in enumerate(groups):
        for word in start_at_speech(group[:1], levels) + group[1:]:
            words.append(
                replace(
                    word,
                    start=offset_s + word.start,
                    end=offset_s + word.end,
                    peak=None if word.peak is None else offset_s + word.peak,
                    segment=index,
                )
            )
    return words


def spread_words(
    tokenizer: Tokenizer, segments: list[WindowSegment], offset_s: float, language: str | None
) -> list[Word]:
    """A pass's words without alignment: each segment's words spread over it by character
    count (`offset_s`: stream seconds of the pass's start); no probability, no peak."""
    words: list[Word] = []
    for index, seg in enumerate(segments):
        split = split_words(tokenizer, seg.tokens, language)
        total = sum(len(w.word.strip()) for w in split) or 1
        span = seg.end - seg.start
        done = 0
        for word in split:
            size = len(word.word.strip())
            begin = offset_s + seg.start + span * done / total
            finish = offset_s + seg.start + span * (done + size) / total
            done += size
            words.append(replace(word, start=begin, end=finish, segment=index))
    return words
