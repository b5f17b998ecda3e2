"""Long-form transcription: 30 s windows, timestamp-based seeking, temperature fallback.

Ported from openai/whisper's `transcribe.py` and faster-whisper's `generate_segments`:

- the log-mel of the whole clip is computed once (30 s of silence appended) and cut into windows
  of 3000 frames starting at `seek` (mel frames of 10 ms);
- each window is encoded once; its cross K/V and prefilled prompt serve every fallback attempt;
- the decoded tokens are split into segments at consecutive timestamp pairs; the window then
  seeks to the last closed timestamp (the unfinished tail is decoded again in the next window), or
  past the whole window when the tokens end in a single timestamp or hold none;
- temperature fallback (0, 0.2 ... 1.0) when the text is too repetitive (zlib compression ratio
  above 2.4, or the repetition guard fired) or too unlikely (average log-prob below -1); a window
  whose no-speech probability is above 0.6 *and* whose average log-prob is below -1 is skipped;
- the previous text (last 223 tokens) is the prompt of the next window, reset after a window
  decoded at a temperature above 0.5.

Streaming (`on_delta`): text is sent as it is decoded, in pieces that never split a UTF-8
character. Only text that belongs to the final segments is sent live: in timestamp mode a
segment's text is released when its closing timestamp is decoded (the unfinished tail of a window
is decoded again by the next window, so it is never sent from the first one); without timestamps
every token is sent at once. A window that may be skipped as silence (no-speech probability above
the threshold) and every retry after a rejected attempt are held back and sent once the window is
accepted. Text sent from an attempt that is later rejected cannot be taken back: the accepted
attempt's text is then sent from the same character offset and a warning is logged. The segments
are authoritative.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import TypeVar

import numpy as np

from app.engine.audio import lift_quiet
from app.engine.backend import WhisperBackend
from app.engine.language_detection import LanguageDetection, language_steps
from app.engine.mel import HOP_LENGTH, log_mel_spectrogram
from app.engine.tokenizer import Tokenizer
from app.engine.vad import SileroVad
from app.engine.vad_spans import collect_speech, speech_time_map, speech_timestamps
from app.runtime.contract import N_FRAMES, N_SAMPLES_PER_WINDOW, SAMPLE_RATE
from app.runtime.steps import Steps
from app.service.transcription.long_form import PROMPT_TOKENS, LongForm
from app.service.transcription.options import TranscriptionOptions
from app.service.transcription.results import Segment, TranscriptionInfo, TranscriptionStats, Word
from app.service.transcription.text_stream import TextStream, WindowStream
from app.service.transcription.window_decode import (
    TOGETHER_KV_BYTES,
    DecodedWindow,
    TranscriptionCancelled,
    WindowPlan,
    decode_window,
    file_plan,
    rows_within,
)
from app.service.transcription.windows import encode_window, file_segments, restore_times
from app.service.transcription.words import WindowAudio, add_words

__all__ = [
    "Segment",
    "Transcriber",
    "TranscriptionCancelled",
    "TranscriptionInfo",
    "TranscriptionOptions",
    "TranscriptionStats",
    "Word",
]

log = logging.getLogger(__name__)
T = TypeVar("T")


class Transcriber:
    """Transcribes audio with one model's sessions and tokenizer. Holds no per-request state, so
    one instance serves concurrent requests."""

    def __init__(
        self, sessions: WhisperBackend, tokenizer: Tokenizer, vad: SileroVad | None = None
    ) -> None:
        self.sessions = sessions
        self.tokenizer = tokenizer
        self.vad = vad  # for the vad_filter option
        self.n_mels = sessions.manifest.dims.n_mels
        self.multilingual = sessions.manifest.multilingual
        self.together_rows = rows_within(TOGETHER_KV_BYTES, sessions)

    # -- public API ------------------------------------------------------------------------------

    def transcribe(
        self,
        audio: np.ndarray,
        options: TranscriptionOptions | None = None,
        on_delta: Callable[[str], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> tuple[Iterator[Segment], TranscriptionInfo]:
        """Transcribe f32 [N] mono 16 kHz audio. Segments are produced lazily by the iterator;
        the mel, and language detection when needed, happen now. Raises TranscriptionCancelled
        (also from the iterator) once `cancel` is set."""
        job, info, time_map = self.sessions.run_steps(self._begin(audio, options, on_delta, cancel))
        segments = self._generate(job)
        if time_map is not None:
            segments = restore_times(segments, time_map, info.duration)
        return segments, info

    def transcription(
        self,
        audio: np.ndarray,
        options: TranscriptionOptions | None = None,
        on_delta: Callable[[str], None] | None = None,
        cancel: threading.Event | None = None,
        on_segment: Callable[[Segment], None] | None = None,
    ) -> Steps[tuple[list[Segment], TranscriptionInfo]]:
        """`transcribe` as one resumable task (`app.runtime.steps`): the VAD and the mel up to
        its first model call, then every window; `on_segment(segment)` for each segment as its
        window is done. Returns every segment and the info."""
        job, info, time_map = yield from self._begin(audio, options, on_delta, cancel)
        segments: list[Segment] = []
        while job.seek < job.content_frames:
            self._check_cancel(job.cancel)
            with job.stats.timed("total_s"):
                kept = yield from self._window(job)
            if time_map is not None:
                kept = list(restore_times(iter(kept), time_map, info.duration))
            for segment in kept:
                segments.append(segment)
                if on_segment is not None:
                    on_segment(segment)
        log.info("%s", job.stats.summary())
        return segments, info

    def _begin(
        self,
        audio: np.ndarray,
        options: TranscriptionOptions | None,
        on_delta: Callable[[str], None] | None,
        cancel: threading.Event | None,
    ) -> Steps[tuple[LongForm, TranscriptionInfo, list[tuple[float, float]] | None]]:
        """A transcription's start: the VAD (`vad_filter`), the mel, and the language when it
        must be detected (window 0 encoded for it); its state, its info, and the VAD's time map
        (None without the VAD)."""
        options = options or TranscriptionOptions()
        audio = np.asarray(audio, dtype=np.float32)
        if audio.ndim != 1:
            raise ValueError(f"audio must be 1-D [N] samples at 16 kHz, got shape {audio.shape}")
        self._check_cancel(cancel)
        stats = TranscriptionStats(audio_s=audio.shape[0] / SAMPLE_RATE)
        with stats.timed("total_s"):  # the VAD, the mel and language detection
            time_map: list[tuple[float, float]] | None = None
            if options.vad_filter:
                if self.vad is None:
                    raise ValueError(
                        "vad_filter needs the Silero VAD model (models/silero_vad.onnx); "
                        "this transcriber was built without one"
                    )
                with stats.timed("vad_s"):
                    spans = speech_timestamps(self.vad, audio, options.vad_options)
                    time_map = speech_time_map(spans)
                    audio = collect_speech(audio, spans)
                log.debug(
                    "VAD: %d speech regions, %.2f of %.2f s kept",
                    len(spans),
                    audio.shape[0] / SAMPLE_RATE,
                    stats.audio_s,
                )

            with stats.timed("mel_s"):
                mel = self.log_mel(audio, padding=N_SAMPLES_PER_WINDOW)
            content_frames = mel.shape[-1] - N_FRAMES

            language = options.language
            language_probability = 1.0
            language_probs: dict[str, float] | None = None
            first_cross: list[np.ndarray] | None = None
            if language is None:
                if self.multilingual:
                    first_cross = yield from self._encode(mel, 0, content_frames, stats)
                    with stats.timed("language_s"):
                        detection = yield from self.detect_language(
                            first_cross, options.kv_cache, options.languages
                        )
                    language, language_probability = detection.language, detection.probability
                    language_probs = detection.probabilities
                    log.info("detected language %s (p=%.2f)", language, language_probability)
                else:
                    language = "en"

        info = TranscriptionInfo(
            language=language,
            language_probability=language_probability,
            duration=stats.audio_s,
            duration_after_vad=audio.shape[0] / SAMPLE_RATE,
            options=options,
            all_language_probs=language_probs,
            stats=stats,
        )
        stream = TextStream(self.tokenizer, on_delta) if on_delta is not None else None
        job = LongForm(
            mel, content_frames, options, language, stats, cancel, self.tokenizer,
            first_cross, stream,
        )  # fmt: skip
        return job, info, time_map

    def run(self, steps: Steps[T]) -> T:
        """Serve a task of this transcriber's (`transcription`, a window, a live pass) here."""
        return self.sessions.run_steps(steps)

    def start(self, steps: Steps[T]) -> Future[T]:
        """Start such a task on the model (`WhisperBackend.start`)."""
        return self.sessions.start(steps)

    # -- one window, for files and live passes ---------------------------------------------------

    def log_mel(self, audio: np.ndarray, padding: int) -> np.ndarray:
        """f32 [N] 16 kHz -> its log-mel [n_mels, frames], `padding` zeros appended first."""
        return log_mel_spectrogram(lift_quiet(audio), self.n_mels, padding=padding)

    def detect_language(
        self, cross: list[np.ndarray], kv_cache: str, candidates: Sequence[str] = ()
    ) -> Steps[LanguageDetection]:
        """The language of the window of `cross`: the most probable of `candidates` (empty:
        of every language the model knows)."""
        return (
            yield from language_steps(self.sessions, cross, self.tokenizer, kv_cache, candidates)
        )

    def decode_window(
        self,
        cross: list[np.ndarray],
        plan: WindowPlan,
        audio_s: float,
        *,
        on_token: Callable[[int], None] | None = None,
        on_attempt: Callable[[bool], None] | None = None,
        cancel: threading.Event | None = None,
        rng: np.random.Generator | None = None,
    ) -> Steps[DecodedWindow]:
        """The window of `cross` decoded by `plan` with this model (`decode_window`)."""
        return (
            yield from decode_window(
                self.sessions, self.tokenizer, self.together_rows, cross, plan, audio_s,
                on_token=on_token, on_attempt=on_attempt, cancel=cancel, rng=rng,
            )
        )  # fmt: skip

    # -- the window loop -------------------------------------------------------------------------

    @staticmethod
    def _check_cancel(cancel: threading.Event | None) -> None:
        if cancel is not None and cancel.is_set():
            raise TranscriptionCancelled("transcription was cancelled")

    @staticmethod
    def _encode(
        mel: np.ndarray, seek: int, content_frames: int, stats: TranscriptionStats
    ) -> Steps[list[np.ndarray]]:
        size = min(N_FRAMES, content_frames - seek)
        with stats.timed("encoder_s"):
            cross = yield from encode_window(mel[:, seek : seek + max(size, 0)])
        stats.windows += 1
        return cross

    def _generate(self, job: LongForm) -> Iterator[Segment]:
        """The windows of one transcription, in order; the time spent on each (not the time
        the consumer takes between segments) goes to `stats.total_s`."""
        while job.seek < job.content_frames:
            self._check_cancel(job.cancel)
            with job.stats.timed("total_s"):
                kept = self.sessions.run_steps(self._window(job))
            yield from kept
        log.info("%s", job.stats.summary())

    def _window(self, job: LongForm) -> Steps[list[Segment]]:
        """Decode the window at `job.seek`, advance `job`, and return its segments (a resumable
        task: its encoder, decoder and aligner calls served by the backend)."""
        tok, options, stats = self.tokenizer, job.options, job.stats
        seek = job.seek
        time_offset = seek * HOP_LENGTH / SAMPLE_RATE  # seconds
        segment_size = min(N_FRAMES, job.content_frames - seek)  # mel frames
        segment_duration = segment_size * HOP_LENGTH / SAMPLE_RATE
        features = job.mel[:, seek : seek + segment_size]  # [n_mels, segment_size]
        if features.min() == features.max():
            # constant features: no signal at all (digital silence), whatever the level;
            # Whisper would write "you" here
            log.debug("window at %.2f s: no signal, skipped", time_offset)
            job.seek += segment_size
            job.first_cross = None
            return []
        if seek == 0 and job.first_cross is not None:
            cross, job.first_cross = job.first_cross, None
        else:
            cross = yield from self._encode(job.mel, seek, job.content_frames, stats)

        hotwords = job.hotwords
        prompt = (
            hotwords + job.all_tokens[job.prompt_reset_since :][-(PROMPT_TOKENS - len(hotwords)) :]
        )
        window = (
            WindowStream(job.stream, not options.without_timestamps, start=len(job.stream.sent))
            if job.stream is not None
            else None
        )
        plan = file_plan(options, job.language, prompt, options.prefix if seek == 0 else None)
        decoded = yield from self.decode_window(
            cross, plan, segment_duration,
            on_token=None if window is None else window.on_token,
            on_attempt=None if window is None else window.new_attempt,
            cancel=job.cancel, rng=job.rng,
        )  # fmt: skip
        for attempt, tried in enumerate(decoded.attempts):
            stats.add_attempt(tried, fallback=attempt > 0)
        result = decoded.result
        if decoded.verdict == "silent":
            log.debug(
                "window at %.2f s: no speech (p=%.2f, avg logprob %.2f), skipped",
                time_offset,
                result.no_speech_prob,
                result.avg_logprob,
            )
            job.seek += segment_size
            return []

        pieces, seek_delta = file_segments(
            result.tokens, tok.timestamp_begin, segment_size, segment_duration
        )
        job.seek += seek_delta
        if window is not None:
            window.finish("".join(tok.decode(p.tokens) for p in pieces))

        kept: list[Segment] = []
        for piece in pieces:
            start = time_offset + piece.start
            end = min(time_offset + piece.end, job.duration)
            start = min(start, end)
            text = tok.decode(piece.tokens)
            if start == end or not text.strip():
                continue
            kept.append(
                Segment(
                    id=job.segment_id,
                    seek=seek,
                    start=round(start, 3),
                    end=round(end, 3),
                    text=text,
                    tokens=piece.decoded,
                    temperature=result.temperature,
                    avg_logprob=result.avg_logprob,
                    compression_ratio=result.compression_ratio,
                    no_speech_prob=result.no_speech_prob,
                )
            )
            job.segment_id += 1
            job.all_tokens.extend(piece.decoded)
            stats.tokens += len(piece.decoded)
        if options.word_timestamps and kept:
            with stats.timed("align_s"):
                window_audio = WindowAudio(
                    cross,
                    features,
                    time_offset,
                    tok.sot_sequence(job.language, options.task),  # type: ignore[arg-type]
                    job.language,
                )
                kept, job.last_speech = yield from add_words(
                    kept, tok, window_audio, job.last_speech
                )
        if (
            not options.condition_on_previous_text
            or result.temperature > options.prompt_reset_on_temperature
        ):
            job.prompt_reset_since = len(job.all_tokens)
        return kept
