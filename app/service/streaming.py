"""Live transcription of one audio stream: incremental decoding with LocalAgreement-2 commits.

A `StreamingSession` receives 16 kHz f32 audio in pieces of any size and produces typed events:

- `PartialText`: the unstable tail (text after the committed part), updated token by token while
  a pass decodes, and once more after the pass; each replaces the previous one.
- `CommittedText`: append-only text that will never change, with its time span (seconds of
  stream time); `StreamSegment` closes a stretch of committed text (at a pause or buffer cut).

How:

    append() -> inbox -> advance(): VAD per 32 ms chunk, admit audio into the buffer
                              buffer = contiguous audio not yet cut away (<= one 30 s window)
    decode(): every `step_s` of new speech: one encoder window over the whole buffer, greedy
              decoding with timestamps (no temperature fallback, no prompt from committed text);
              the words two consecutive passes agree on (longest common prefix beyond the
              committed words) are committed (LocalAgreement-2).

- Committed segments are not decoded again: the closed segments whose words are all committed
  are forced as the decoder prefix of the next pass (one prefill call instead of a step per
  token), so each pass decodes only the uncommitted tail while the audio before it stays as
  context. Once the buffer is longer than `trim_s` it is cut at the end of a committed segment.
- VAD: while no one speaks nothing is decoded, so silence never turns into text. When speech
  has ended and `VadOptions.min_silence_s` of silence followed, the utterance is finalized:
  decoded once more if the last pass did not cover it, every remaining word committed. Its audio
  stays as context for the next utterance unless the silence lasts `context_gap_s`; then only
  `preroll_s` of audio is kept.
- Audio that arrives faster than it is decoded waits in the inbox and the next pass covers all
  of it (coalescing); the buffer never exceeds one 30 s window (a pass on a buffer longer than
  `max_buffer_s` commits up to its last closed segment even without agreement).
- `flush()` (client commit, end of stream) finalizes everything received so far.
- Memory: the buffer (<= 30 s), the inbox (bounded by the caller) and the committed text.

Word times: with `StreamingOptions.word_timestamps` each pass is aligned (`app.engine.timing`:
the alignment heads' cross-attention and DTW, one aligner call per pass) and every word carries
its measured time; otherwise they are spread over their segment's timestamps by character count.

Threads: `append`/`flush` may be called from any thread; `advance` and `decode` must be called
by one caller at a time (the API's per-connection task), on worker threads. Events are passed to
the `on_event` callback from the thread that runs `advance`/`decode`.
"""

from __future__ import annotations

import difflib
import logging
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import soxr

from app.engine.audio import AudioDecodeError, PcmEncoding, lift_quiet, pcm_to_float
from app.engine.decoding import DecodingCancelled, DecodingOptions, DecodingResult, DecodingTask
from app.engine.mel import HOP_LENGTH, log_mel_spectrogram, pad_or_trim
from app.engine.timing import (
    TextClock,
    align_words,
    frame_levels,
    group_words,
    start_at_speech,
)
from app.engine.tokenizer import Tokenizer
from app.engine.vad import SileroVad, VadOptions, VadStream
from app.runtime.contract import N_FRAMES, N_SAMPLES_PER_WINDOW, SAMPLE_RATE, TIME_PRECISION
from app.service.transcriber import Transcriber, TranscriptionCancelled

log = logging.getLogger(__name__)

WINDOW_S = N_SAMPLES_PER_WINDOW / SAMPLE_RATE  # 30.0
ADMIT_SLICE = SAMPLE_RATE // 4  # audio is admitted (VAD + buffer) 0.25 s at a time
MAX_PREFIX_TOKENS = 160  # a longer forced prefix cuts the buffer
STALL_S = 1.5  # a pass whose text ends this long before its audio stopped early
FINAL_END_SLACK_S = 1.0  # a finalized last segment ending this close to the pause is closed there
FINAL_PASSES = 3  # most passes one finalization may take
CUT_REPEAT_S = 0.3  # a committed word decoded again this close to a buffer cut is a repeat
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_UNIT = re.compile(rf"\s*[{_CJK}]|\s*[^\s{_CJK}]+|\s+$")


# ---- options and events -----------------------------------------------------------------------


@dataclass(frozen=True)
class StreamingOptions:
    """How one stream is decoded (seconds for durations). Validated once (ValueError).

    language: fixed for the session; None = English for English-only models, detected on the
        first pass (then fixed) for multilingual ones.
    step_s: new audio between two passes. trim_s: the buffer is cut at a committed segment end
        once longer than this. max_buffer_s: beyond it a pass commits up to its last closed
        segment without waiting for agreement (the buffer never exceeds one 30 s window).
    vad: speech detection options; None = no VAD (every step decodes, nothing finalizes at
        pauses). preroll_s: audio kept before detected speech. context_gap_s: finalized audio
        is kept as context for the next words until a silence this long.
    prompt: text that conditions every pass (names, spelling). condition_on_committed: also
        prompt with the last committed text (off: it feeds repetition loops).
    word_timestamps: measure word times (an aligner call per pass) instead of estimating them.
    """

    language: str | None = None
    task: str = "transcribe"
    step_s: float = 1.0
    trim_s: float = 10.0
    max_buffer_s: float = 20.0
    vad: VadOptions | None = field(default_factory=VadOptions)
    preroll_s: float = 0.3
    context_gap_s: float = 3.0
    prompt: str | None = None
    condition_on_committed: bool = False
    no_speech_threshold: float | None = 0.6
    log_prob_threshold: float = -1.0
    kv_cache: str = "concat"
    word_timestamps: bool = False

    def __post_init__(self) -> None:
        if not 0.1 <= self.step_s <= 10.0:
            raise ValueError(f"step_s must be in [0.1, 10] seconds, got {self.step_s}")
        if not 0 < self.trim_s <= self.max_buffer_s <= WINDOW_S - 2:
            raise ValueError(
                f"need 0 < trim_s <= max_buffer_s <= {WINDOW_S - 2:g} s, got "
                f"{self.trim_s} and {self.max_buffer_s}"
            )
        if not 0 <= self.preroll_s <= 2.0:
            raise ValueError(f"preroll_s must be in [0, 2], got {self.preroll_s}")
        if self.task not in ("transcribe", "translate"):
            raise ValueError(f"task must be 'transcribe' or 'translate', got {self.task!r}")


@dataclass(frozen=True)
class PartialText:
    """The unstable tail after the committed text; replaces the previous partial."""

    text: str


@dataclass(frozen=True)
class CommittedText:
    """Committed text (append-only; starts with a space between words) and its time span in
    seconds of stream time (estimated from segment timestamps)."""

    text: str
    start: float
    end: float


@dataclass(frozen=True)
class StreamSegment:
    """A closed stretch of committed text (seconds of stream time)."""

    id: int
    start: float
    end: float
    text: str


StreamEvent = PartialText | CommittedText | StreamSegment


@dataclass(frozen=True)
class StreamStats:
    """Counters of one session (seconds)."""

    received_s: float
    committed_words: int
    passes: int
    skipped_passes: int  # passes dropped as silence or as a repetition loop
    decode_s: float
    buffer_s: float
    inbox_s: float


# ---- input ------------------------------------------------------------------------------------

ENCODINGS: tuple[str, ...] = ("pcm_s16le", "pcm_f32le")
MIN_RATE, MAX_RATE = 8000, 192000


class PcmInput:
    """Raw client PCM (mono, `encoding`, `sample_rate` Hz) -> f32 16 kHz, chunk by chunk.

    The resampler keeps its state between chunks, so chunk edges leave no artefacts; `finish()`
    returns the samples it still holds. Raises AudioDecodeError for a chunk that is not a whole
    number of samples or holds NaN/infinite floats (the chunk is then dropped).
    """

    def __init__(self, encoding: str, sample_rate: int) -> None:
        if encoding not in ENCODINGS:
            raise ValueError(f"encoding must be one of {', '.join(ENCODINGS)}, got {encoding!r}")
        if not MIN_RATE <= sample_rate <= MAX_RATE:
            raise ValueError(f"sample_rate must be in {MIN_RATE}..{MAX_RATE} Hz, got {sample_rate}")
        self.encoding: PcmEncoding = encoding  # type: ignore[assignment]
        self.sample_rate = sample_rate
        self._resampler = (
            soxr.ResampleStream(sample_rate, SAMPLE_RATE, 1, dtype="float32", quality="HQ")
            if sample_rate != SAMPLE_RATE
            else None
        )

    def convert(self, data: bytes) -> np.ndarray:
        """f32 [M] 16 kHz samples of one chunk (M may be 0 while the resampler fills)."""
        audio = pcm_to_float(data, self.encoding)
        if self._resampler is None:
            return audio
        return self._resampler.resample_chunk(audio)

    def finish(self) -> np.ndarray:
        if self._resampler is None:
            return np.zeros(0, np.float32)
        return self._resampler.resample_chunk(np.zeros(0, np.float32), last=True)


__all__ = [
    "AudioDecodeError",
    "CommittedText",
    "PartialText",
    "PcmInput",
    "SileroVad",
    "StreamEvent",
    "StreamSegment",
    "StreamingOptions",
    "StreamingSession",
    "TranscriptionCancelled",
    "VadOptions",
]


# ---- words ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Word:
    text: str  # as decoded, with its leading space
    key: str  # normalised for comparison
    start: float  # stream seconds
    end: float
    segment: int  # index of the segment in its pass


def _key(text: str) -> str:
    kept = "".join(c for c in text.lower() if c.isalnum())
    return kept or text.strip().lower()


def split_units(text: str) -> list[str]:
    """Words with their leading whitespace (CJK characters are units of their own);
    `"".join(split_units(t)) == t` up to trailing whitespace."""
    return [u for u in _UNIT.findall(text) if u.strip()]


@dataclass(frozen=True)
class _Segment:
    start: float  # seconds from the buffer start
    end: float
    tokens: tuple[int, ...]
    closed: bool  # ended by a timestamp token


def split_segments(tokens: Sequence[int], timestamp_begin: int, duration: float) -> list[_Segment]:
    """Cut one window's tokens into segments at timestamp tokens; keep the unfinished tail.

    `<|a|> text <|b|><|b|> text <|c|>` -> [a, b) and [b, c); text after the last timestamp is an
    open segment ending at `duration`.
    """
    segments: list[_Segment] = []
    start: float | None = None
    text: list[int] = []
    for t in tokens:
        if t >= timestamp_begin:
            ts = min((t - timestamp_begin) * TIME_PRECISION, duration)
            if text:
                begin = start if start is not None else 0.0
                segments.append(_Segment(begin, max(ts, begin), tuple(text), True))
                text = []
            start = ts
        else:
            text.append(t)
    if text:
        begin = start if start is not None else 0.0
        segments.append(_Segment(begin, max(duration, begin), tuple(text), False))
    return segments


def _align(
    committed: Sequence[str],
    hyp: Sequence[str],
    hyp_mid_s: Sequence[float] | None = None,
    committed_end_s: float | None = None,
) -> int:
    """Index in `hyp` where the words after `committed` begin (both are word keys).

    The pass usually repeats the committed words; when it spells or splits them differently,
    the last committed words are looked up near where they are expected, then matched with
    difflib. Committed words the pass does not have are not skipped blindly: a hyp word after
    the last match counts as committed when it is spelled like the committed word there
    ("apologize"/"apologise") or its middle (`hyp_mid_s`, stream seconds) lies before the end
    of the committed text (`committed_end_s`); without times, by position.
    """
    n = len(committed)
    if n == 0:
        return 0
    if list(hyp[:n]) == list(committed):
        return n
    # the last few committed words, found near where they are expected
    for m in (3, 2):
        if n < m:
            continue
        tail = list(committed[-m:])
        candidates = [
            k
            for k in range(max(m, n - 3), min(len(hyp), n + 3) + 1)
            if list(hyp[k - m : k]) == tail
        ]
        if candidates:
            return min(candidates, key=lambda k: abs(k - n))
    matcher = difflib.SequenceMatcher(None, list(committed), list(hyp[: n + 5]), autojunk=False)
    blocks = [b for b in matcher.get_matching_blocks() if b.size]
    k, unmatched = (
        (blocks[-1].b + blocks[-1].size, n - blocks[-1].a - blocks[-1].size) if blocks else (0, n)
    )
    for i in range(n - unmatched, n):
        if k >= len(hyp):
            break
        respelled = difflib.SequenceMatcher(None, committed[i], hyp[k]).ratio() >= 0.75
        timed = hyp_mid_s is not None and committed_end_s is not None
        if not respelled and timed and hyp_mid_s[k] > committed_end_s:  # type: ignore[index]
            break  # a different word, later than the committed text: a new one
        k += 1
    return k


# ---- audio buffer -----------------------------------------------------------------------------


class _AudioBuffer:
    """Contiguous audio f32 [length] starting at absolute sample `start`, fixed capacity."""

    def __init__(self, capacity: int) -> None:
        self._data = np.zeros(capacity, np.float32)
        self.start = 0
        self.length = 0

    @property
    def end(self) -> int:
        return self.start + self.length

    @property
    def capacity(self) -> int:
        return self._data.shape[0]

    def append(self, audio: np.ndarray) -> None:
        n = audio.shape[0]
        if self.length + n > self.capacity:
            raise OverflowError(f"audio buffer full ({self.length} + {n} > {self.capacity})")
        self._data[self.length : self.length + n] = audio
        self.length += n

    def drop_before(self, sample: int) -> None:
        """Forget the audio before absolute `sample`."""
        n = min(max(sample - self.start, 0), self.length)
        if n:
            self._data[: self.length - n] = self._data[n : self.length]
            self.length -= n
            self.start += n

    def view(self, until: int | None = None) -> np.ndarray:
        stop = self.length if until is None else min(max(until - self.start, 0), self.length)
        return self._data[:stop].copy()


# ---- the session ------------------------------------------------------------------------------


@dataclass
class _Pass:
    words: list[_Word]
    segments: list[_Segment]
    start: int  # absolute sample of the decoded audio's start
    end: int
    result: DecodingResult | None  # None: the audio held no speech


class StreamingSession:
    """One live stream; see the module docstring."""

    def __init__(
        self,
        transcriber: Transcriber,
        options: StreamingOptions,
        vad: SileroVad | None = None,
        on_event: Callable[[StreamEvent], None] | None = None,
    ) -> None:
        if options.vad is not None and vad is None:
            raise ValueError("options.vad is set but no VAD model was given")
        self.transcriber = transcriber
        self.tokenizer: Tokenizer = transcriber.tokenizer
        self.options = options
        self.on_event = on_event or (lambda _e: None)
        self.language = options.language or (None if transcriber.multilingual else "en")
        self._vad = VadStream(vad, options.vad) if options.vad is not None and vad else None
        self._prompt = (
            tuple(self.tokenizer.encode(" " + options.prompt.strip())) if options.prompt else ()
        )

        self._inbox: deque[np.ndarray] = deque()
        self._inbox_lock = threading.Lock()
        self._inbox_samples = 0
        self._received = 0  # samples appended in total
        self._flush_at: int | None = None  # finalize once everything before it is admitted

        self._buf = _AudioBuffer(N_SAMPLES_PER_WINDOW + 2 * ADMIT_SLICE)
        self._open = self._vad is None  # an utterance is being buffered
        self._utterance_start = 0  # absolute sample where the open utterance's speech began
        self._speech_end = 0  # absolute sample where the last utterance's speech ended
        self._final_until: int | None = None  # finalize the buffer up to this sample
        self._decoded_until = 0  # end (absolute sample) of the audio the last pass covered
        self._committed_in_buffer: list[_Word] = []  # committed words still inside the buffer
        self._previous: list[_Word] = []  # uncommitted words of the last pass
        self._prefix: list[_Segment] = []  # committed closed segments: the next pass's prefix
        self._last_pass: _Pass | None = None  # the last pass, while the buffer is unchanged
        self._segment_words: list[_Word] = []  # committed since the last StreamSegment
        self._committed_end = 0.0  # stream seconds where the committed text ends
        self._last_partial = ""
        self._recent: deque[_Word] = deque(maxlen=5)  # the last committed words

        self._text: list[str] = []
        self._n_words = 0
        self._segment_id = 0
        self._passes = 0
        self._skipped = 0
        self._decode_s = 0.0

    # ---- input (any thread) ----------------------------------------------------------------
    def append(self, audio: np.ndarray) -> None:
        """Queue f32 [N] 16 kHz audio (cheap; the work happens in `advance`/`decode`)."""
        audio = np.asarray(audio, dtype=np.float32).reshape(-1)
        if not audio.shape[0]:
            return
        with self._inbox_lock:
            self._inbox.append(audio)
            self._inbox_samples += audio.shape[0]
            self._received += audio.shape[0]

    def flush(self) -> None:
        """Finalize everything appended so far (client commit or end of stream)."""
        with self._inbox_lock:
            self._flush_at = self._received

    @property
    def received_s(self) -> float:
        return self._received / SAMPLE_RATE

    @property
    def inbox_s(self) -> float:
        """Audio appended but not yet admitted (it waits for a pass when decoding lags)."""
        return self._inbox_samples / SAMPLE_RATE

    @property
    def text(self) -> str:
        """All committed text."""
        return "".join(self._text).strip()

    def stats(self) -> StreamStats:
        return StreamStats(
            received_s=self.received_s,
            committed_words=self._n_words,
            passes=self._passes,
            skipped_passes=self._skipped,
            decode_s=self._decode_s,
            buffer_s=self._buf.length / SAMPLE_RATE,
            inbox_s=self.inbox_s,
        )

    # ---- admission (VAD) -------------------------------------------------------------------
    def advance(self) -> bool:
        """Run VAD over queued audio and admit it into the buffer; True if a pass is due.

        Stops early when the buffer is full (a pass must cut it first) or a finalization is due.
        """
        while self._final_until is None:
            room = self._buf.capacity - self._buf.length - ADMIT_SLICE
            if self._open and room <= 0:
                break
            piece = self._take(ADMIT_SLICE)
            if piece is None:
                break
            self._admit(piece)
        with self._inbox_lock:
            flush_due = (
                self._flush_at is not None
                and self._received - self._inbox_samples >= self._flush_at
                and self._final_until is None
            )
            if flush_due:
                self._flush_at = None
        if flush_due:
            self._request_final(self._buf.end, "flush", speech=self._open)
        return self.decode_due()

    def _take(self, n: int) -> np.ndarray | None:
        with self._inbox_lock:
            if not self._inbox:
                return None
            first = self._inbox[0]
            if first.shape[0] <= n:
                self._inbox.popleft()
                piece = first
            else:
                piece = first[:n]
                self._inbox[0] = first[n:]
            self._inbox_samples -= piece.shape[0]
            return piece

    def _admit(self, piece: np.ndarray) -> None:
        self._buf.append(piece)
        if self._vad is None:
            return
        assert self.options.vad is not None
        preroll = round(self.options.preroll_s * SAMPLE_RATE)
        for event in self._vad.feed(piece):
            if event.kind == "start" and not self._open:
                self._open = True
                self._utterance_start = event.sample
                if self._nothing_to_keep():  # drop the silence before the preroll
                    self._buf.drop_before(event.sample - preroll)
                # the next pass is due `step_s` after the speech began, not after the pause
                onset = min(max(event.sample - preroll, self._buf.start), self._buf.end)
                self._decoded_until = max(self._decoded_until, onset)
            elif event.kind == "end" and self._open:
                self._open = False
                self._speech_end = event.sample
                speech_s = (event.sample - self._utterance_start) / SAMPLE_RATE
                if speech_s < self.options.vad.min_speech_s and not self._previous:
                    log.debug("ignored %.2f s of speech (shorter than min_speech_s)", speech_s)
                    continue
                pad = round(self.options.vad.speech_pad_s * SAMPLE_RATE)
                self._request_final(min(event.sample + pad, self._buf.end), "pause", speech=True)
        if not self._open and self._final_until is None:
            gap = self._buf.end - max(self._speech_end, self._buf.start)
            if self._nothing_to_keep() or gap > round(self.options.context_gap_s * SAMPLE_RATE):
                if self._committed_in_buffer:
                    log.debug("context dropped after %.1f s of silence", gap / SAMPLE_RATE)
                self._buf.drop_before(self._buf.end - preroll)  # keep the preroll only
                self._committed_in_buffer = []
                self._prefix = []
                self._last_pass = None
                self._decoded_until = max(self._decoded_until, self._buf.start)

    def _nothing_to_keep(self) -> bool:
        """The buffer holds no words (committed context or pending) worth keeping."""
        return not self._committed_in_buffer and not self._previous and self._final_until is None

    def _request_final(self, until: int, reason: str, *, speech: bool) -> None:
        """Finalize the buffer up to `until` at the next pass (if it may hold words)."""
        if self._final_until is not None:
            return
        if (speech and until > self._buf.start) or self._previous:
            log.debug("finalize (%s) at %.2f s", reason, until / SAMPLE_RATE)
            self._final_until = max(until, self._buf.start)

    def decode_due(self) -> bool:
        """A pass has work: a finalization, or `step_s` of new audio in an open utterance."""
        if self._final_until is not None:
            return True
        if not self._open:
            return False
        new = self._buf.end - max(self._decoded_until, self._buf.start)
        return new >= round(self.options.step_s * SAMPLE_RATE)

    @property
    def idle(self) -> bool:
        """Nothing queued and no pass due."""
        return self._inbox_samples == 0 and not self.decode_due() and self._flush_at is None

    # ---- decoding (worker thread) ----------------------------------------------------------
    def decode(self, cancel: threading.Event | None = None) -> None:
        """Run the due pass (if any) and emit its events. Raises TranscriptionCancelled."""
        if self._final_until is not None:
            self._finalize(cancel)
        elif self.decode_due():
            self._step(cancel)

    def _finalize(self, cancel: threading.Event | None) -> None:
        """Commit every word up to `_final_until`; the audio stays as context for what follows
        (VAD drops it after `context_gap_s` of silence; passes cut it at segment ends).

        When the decoder stopped early (its text ends `STALL_S` before the audio does), the
        buffer is cut after that text and the rest is decoded again (up to `FINAL_PASSES`)."""
        until = self._final_until
        assert until is not None
        for attempt in range(FINAL_PASSES):
            decoded = self._last_pass if attempt == 0 else None
            words = list(self._previous) if attempt == 0 else []
            stale = attempt > 0 or self._decoded_until < until
            if stale and until - self._buf.start >= SAMPLE_RATE // 10:
                fresh = self._run_pass(self._buf.view(until), self._buf.start, cancel)
                self._decoded_until = max(self._decoded_until, fresh.end)
                if fresh.result is not None and not fresh.result.looped:
                    decoded = fresh
                    words = fresh.words[self._skip_repeats(fresh.words, self._align(fresh.words)) :]
                # else: keep what the last good pass said
            else:
                log.debug("finalize without decoding: %d words", len(words))
            self._commit(words)
            self._committed_in_buffer = self._committed_in_buffer + words
            self._previous = []
            stalled = False
            if decoded is not None and decoded.start == self._buf.start:
                self._committed_in_buffer = list(decoded.words)
                final_end_s = (until - decoded.start) / SAMPLE_RATE
                stalled = self._settle(
                    decoded, len(decoded.words), forced=False, final_end_s=final_end_s
                )
            self._last_pass = None
            if not stalled or until - self._buf.start < SAMPLE_RATE // 2:
                break
            log.debug(
                "finalize: decoding the %.2f s the decoder skipped",
                (until - self._buf.start) / SAMPLE_RATE,
            )
        self._final_until = None
        self._close_segment()
        self._emit_partial("")

    def _step(self, cancel: threading.Event | None) -> None:
        decoded = self._run_pass(self._buf.view(), self._buf.start, cancel)
        self._decoded_until = decoded.end
        self._last_pass = None
        buffer_s = (decoded.end - decoded.start) / SAMPLE_RATE
        forced = buffer_s > self.options.max_buffer_s
        if decoded.result is None or decoded.result.looped:
            if forced:  # a full buffer that gives no words: settle what there is, move on
                self._commit(self._previous)
                self._previous = []
                self._close_segment()
                self._buf.drop_before(decoded.end)
                self._committed_in_buffer = []
                self._prefix = []
            self._emit_partial(self._partial_text(self._previous))
            return
        hyp = decoded.words
        k = self._skip_repeats(hyp, self._align(hyp))
        new = hyp[k:]
        agreed = 0
        for a, b in zip(new, self._previous, strict=False):
            if a.key != b.key:
                break
            agreed += 1
        if forced:
            # commit through the last closed segment that is not the pass's last segment
            closed = [i for i, s in enumerate(decoded.segments[:-1]) if s.closed]
            if closed:
                upto = max((i + 1 for i, w in enumerate(hyp) if w.segment <= closed[-1]), default=k)
                agreed = max(agreed, upto - k)
        commit = new[:agreed]
        self._commit(commit)
        self._committed_in_buffer = hyp[: k + agreed]
        self._previous = new[agreed:]
        self._last_pass = decoded
        self._settle(decoded, k + agreed, forced=forced)
        if forced and self._buf.length > round(self.options.max_buffer_s * SAMPLE_RATE):
            # no segment boundary to cut at: commit the whole pass and start afresh
            log.info("buffer of %.1f s has no committed segment end: committing it", buffer_s)
            self._commit(self._previous)
            self._previous, self._committed_in_buffer, self._prefix = [], [], []
            self._last_pass = None
            self._close_segment()
            self._buf.drop_before(decoded.end)
        self._emit_partial(self._partial_text(self._previous))

    def _settle(
        self, decoded: _Pass, done: int, *, forced: bool, final_end_s: float | None = None
    ) -> bool:
        """After a pass whose words hyp[:done] are committed: the closed segments holding only
        committed words become the forced prefix of the next pass; a buffer longer than `trim_s`
        is cut at the end of one of them (keeping up to half of `trim_s` as context).

        The pass's last segment may still grow and stays out, except
        - after a finalization (`final_end_s`: where the VAD found the speech over, seconds from
          the pass start), when it ends near there: then it is closed at `final_end_s`. Whisper's
          own end for it was placed with no audio after it, often inside the last word, and
          forcing that made the next pass decode the word's tail again ("for you you ask");
        - when the decoder closed it and stopped `STALL_S` or more before the audio's end: whisper
          sometimes ends a window early and then keeps doing so as the buffer grows (the speech
          after it never gets decoded). The buffer is then cut right after it, whatever its
          length, so the next pass starts on the skipped speech. Returns True in that case.
        """
        hyp, segments = decoded.words, list(decoded.segments)
        audio_s = (decoded.end - decoded.start) / SAMPLE_RATE
        limit = len(segments) - 1
        stalled = False
        if segments and segments[-1].closed:
            last = segments[-1]
            if final_end_s is not None and final_end_s - last.end <= FINAL_END_SLACK_S:
                end = max(last.end, min(final_end_s, WINDOW_S))
                segments[-1] = _Segment(last.start, end, last.tokens, True)
                limit = len(segments)
            elif min(audio_s, final_end_s or audio_s) - last.end >= STALL_S:
                limit = len(segments)
                stalled = True
        covered = -1
        for i in range(limit):
            if not segments[i].closed:
                break
            last_word = max((j for j, w in enumerate(hyp) if w.segment == i), default=-1)
            if last_word >= done:
                break
            covered = i
        stalled = stalled and covered == len(segments) - 1
        self._prefix = list(segments[: covered + 1])
        buffer_s = audio_s
        prefix_tokens = sum(len(s.tokens) + 2 for s in self._prefix)
        too_long = buffer_s > self.options.trim_s or prefix_tokens > MAX_PREFIX_TOKENS
        if covered < 0 or not (too_long or forced or stalled):
            return False
        keep_s = self.options.trim_s / 2
        ends = [s.end for s in self._prefix]
        fitting = [i for i, e in enumerate(ends) if buffer_s - e <= keep_s]
        cut_index = len(ends) - 1 if stalled or not fitting else fitting[0]
        cut_s = ends[cut_index]
        cut = decoded.start + round(cut_s * SAMPLE_RATE)
        first_kept = max((j + 1 for j, w in enumerate(hyp) if w.segment <= cut_index), default=0)
        self._buf.drop_before(cut)
        self._committed_in_buffer = self._committed_in_buffer[first_kept:]
        self._prefix = [
            _Segment(s.start - cut_s, s.end - cut_s, s.tokens, s.closed)
            for s in self._prefix[cut_index + 1 :]
        ]
        self._last_pass = None
        self._close_segment()
        log.debug("buffer cut at %.2f s (segment end%s)", cut / SAMPLE_RATE,
                  ", the decoder stopped there" if stalled else "")  # fmt: skip
        return stalled

    def _align(self, hyp: list[_Word]) -> int:
        """Where the uncommitted words of a pass begin (see `_align`)."""
        return _align(
            self._keys(self._committed_in_buffer),
            self._keys(hyp),
            [(w.start + w.end) / 2 for w in hyp],
            self._committed_end,
        )

    def _skip_repeats(self, hyp: list[_Word], k: int) -> int:
        """Move `k` past words that repeat the last committed words: a pass sometimes decodes
        the end of committed speech again. 2 to 5 words anywhere at the boundary; a single word
        only at the very start of a buffer that was just cut after it (a segment end that
        Whisper placed inside the word's sound: "billion and | and profit")."""
        recent = list(self._recent)
        for n in range(min(5, len(recent), len(hyp) - k), 1, -1):
            if [w.key for w in hyp[k : k + n]] == [w.key for w in recent[-n:]]:
                log.debug("skipped %d repeated words at the commit boundary", n)
                return k + n
        buffer_start_s = self._buf.start / SAMPLE_RATE
        if (
            k == 0
            and hyp
            and recent
            and hyp[0].key == recent[-1].key
            and hyp[0].start - buffer_start_s < CUT_REPEAT_S
        ):
            log.debug("skipped %r repeated after the buffer cut", hyp[0].text)
            return 1
        return k

    def _prefix_tokens(self) -> tuple[tuple[int, ...], int]:
        """The forced prefix (closed committed segments, with their timestamps) and how many
        words it holds."""
        tok = self.tokenizer
        tokens: list[int] = []
        n_words = 0
        for seg in self._prefix:
            start = tok.timestamp_begin + round(seg.start / TIME_PRECISION)
            end = tok.timestamp_begin + round(seg.end / TIME_PRECISION)
            tokens += [start, *seg.tokens, end]
            n_words += len(split_units(tok.decode(seg.tokens)))
        return tuple(tokens), n_words

    def _run_pass(self, audio: np.ndarray, start: int, cancel: threading.Event | None) -> _Pass:
        """Decode f32 audio (<= 30 s) that starts at absolute sample `start`; the committed
        closed segments are forced as a prefix (not decoded again)."""
        t0 = time.perf_counter()
        audio = audio[:N_SAMPLES_PER_WINDOW]
        end = start + audio.shape[0]
        sessions, tok = self.transcriber.sessions, self.tokenizer
        # 1 s of zeros after the audio gives the same frames as the 30 s the transcriber appends
        mel = log_mel_spectrogram(lift_quiet(audio), self.transcriber.n_mels, padding=SAMPLE_RATE)
        content = audio.shape[0] // HOP_LENGTH
        window = pad_or_trim(mel[:, : min(content, N_FRAMES)], N_FRAMES)  # [n_mels, 3000]
        if cancel is not None and cancel.is_set():
            raise TranscriptionCancelled("stream closed")
        cross = sessions.encode(np.ascontiguousarray(window[None]))  # [1, H, 1500, Dh] each
        prompt = self._prompt + self._committed_prompt()
        prefix, prefix_words = self._prefix_tokens() if start == self._buf.start else ((), 0)
        options = DecodingOptions(
            task=self.options.task,
            language=self.language,
            temperature=0.0,
            prompt=prompt or None,
            prefix=prefix or None,
            max_initial_timestamp=None if prefix else 1.0,
            kv_cache=self.options.kv_cache,
        )
        task = DecodingTask(sessions, cross, tok, options)
        if self.language is None:
            self.language = task.language
            log.info("stream language detected: %s", self.language)
        skip = max(len(self._committed_in_buffer) - prefix_words, 0)
        try:
            result = task.run(self._live_partial(skip), cancel)
        except DecodingCancelled as e:
            raise TranscriptionCancelled(str(e)) from e
        self._passes += 1
        self._decode_s += time.perf_counter() - t0
        duration = audio.shape[0] / SAMPLE_RATE
        silent = (
            self.options.no_speech_threshold is not None
            and result.no_speech_prob > self.options.no_speech_threshold
            and result.avg_logprob < self.options.log_prob_threshold
            and not prefix
        )
        if silent or result.looped:
            self._skipped += 1
            log.debug(
                "pass over %.2f s dropped: %s (no-speech %.2f, avg logprob %.2f)",
                duration,
                "looped" if result.looped else "no speech",
                result.no_speech_prob,
                result.avg_logprob,
            )
            return _Pass([], [], start, end, None if silent else result)
        segments = split_segments((*prefix, *result.tokens), tok.timestamp_begin, duration)
        clock = None
        if self.options.word_timestamps:
            timed = align_words(
                sessions,
                cross,
                tok,
                tok.sot_sequence(self.language, self.options.task),  # type: ignore[arg-type]
                self.language,
                [t for seg in segments for t in seg.tokens],
                n_frames=min(content, N_FRAMES) // 2,
            )
            groups = group_words(timed, [len(seg.tokens) for seg in segments])
            start_at_speech(
                [group[0] for group in groups if group],
                frame_levels(mel[:, : min(content, N_FRAMES)]),
            )
            clock = TextClock(timed)
        words = self._words(segments, start / SAMPLE_RATE, clock)
        log.debug(
            "pass over %.2f s in %.0f ms: prefix %d tokens, %d new, %d segments, %d words",
            duration,
            1e3 * (time.perf_counter() - t0),
            len(prefix),
            len(result.tokens),
            len(segments),
            len(words),
        )
        return _Pass(words, segments, start, end, result)

    def _words(
        self, segments: list[_Segment], offset_s: float, clock: TextClock | None = None
    ) -> list[_Word]:
        """Words of every segment, timed by `clock` (measured, over the segments' joined text)
        or else spread over their segment by character count."""
        texts = [self.tokenizer.decode(seg.tokens) for seg in segments]
        if clock is not None and clock.text != "".join(texts):
            log.warning("aligned words do not spell the pass's text; word times estimated")
            clock = None
        words: list[_Word] = []
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
                if clock is not None:
                    first = char + at + len(unit) - len(unit.lstrip())
                    start, end = clock.span(first, char + at + len(unit.rstrip()) - 1)
                    start, end = offset_s + start, offset_s + end
                else:
                    start = offset_s + seg.start + span * done / total
                    end = offset_s + seg.start + span * (done + size) / total
                done += size
                at += len(unit)
                words.append(_Word(unit, _key(unit), start, end, index))
            char += len(text)
        return words

    def _committed_prompt(self) -> tuple[int, ...]:
        if not self.options.condition_on_committed or not self._text:
            return ()
        tail = "".join(self._text)[-400:]
        return tuple(self.tokenizer.encode(tail)[-100:])

    # ---- output ----------------------------------------------------------------------------
    @staticmethod
    def _keys(words: Sequence[_Word]) -> list[str]:
        return [w.key for w in words]

    def _commit(self, words: Sequence[_Word]) -> None:
        if not words:
            return
        text = "".join(w.text for w in words)
        if not self._text:
            text = text.lstrip()
        elif not text[:1].isspace() and not _is_cjk(text[:1]):
            text = " " + text
        start = max(words[0].start, self._committed_end)
        end = max(words[-1].end, start)
        self._committed_end = end
        self._recent.extend(words)
        self._text.append(text)
        self._n_words += len(words)
        self._segment_words.extend(words)
        self.on_event(CommittedText(text, round(start, 3), round(end, 3)))

    def _close_segment(self) -> None:
        if not self._segment_words:
            return
        words = self._segment_words
        text = "".join(w.text for w in words).strip()
        self.on_event(
            StreamSegment(
                self._segment_id,
                round(words[0].start, 3),
                round(max(words[-1].end, words[0].start), 3),
                text,
            )
        )
        self._segment_id += 1
        self._segment_words = []

    def _partial_text(self, words: Sequence[_Word]) -> str:
        return "".join(w.text for w in words)

    def _emit_partial(self, text: str) -> None:
        if text != self._last_partial:
            self._last_partial = text
            self.on_event(PartialText(text))

    def _live_partial(self, skip: int) -> Callable[[int], None]:
        """on_token for a pass: the text decoded so far, minus `skip` committed words."""
        tok = self.tokenizer
        tokens: list[int] = []

        def on_token(token: int) -> None:
            if token >= tok.eot:
                return
            tokens.append(token)
            text = tok.decode(tokens)
            if text.endswith("\ufffd"):
                return
            units = split_units(text)
            if len(units) > skip:
                self._emit_partial("".join(units[skip:]))

        return on_token


def _is_cjk(char: str) -> bool:
    return bool(char) and re.match(f"[{_CJK}]", char) is not None
