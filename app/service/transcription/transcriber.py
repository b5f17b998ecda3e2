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
from dataclasses import InitVar, dataclass, field

import numpy as np

from app.engine.audio import lift_quiet
from app.engine.backend import WhisperBackend
from app.engine.decoding import DecodingTask, PrefixMemo
from app.engine.decoding_types import DecodingCancelled, DecodingResult
from app.engine.language_detection import detect_language
from app.engine.mel import HOP_LENGTH, log_mel_spectrogram
from app.engine.tokenizer import Tokenizer
from app.engine.vad import SileroVad
from app.engine.vad_spans import collect_speech, speech_time_map, speech_timestamps
from app.runtime.contract import N_FRAMES, N_SAMPLES_PER_WINDOW, SAMPLE_RATE
from app.service.transcription.options import TranscriptionOptions
from app.service.transcription.results import Segment, TranscriptionInfo, TranscriptionStats, Word
from app.service.transcription.text_stream import TextStream, WindowStream
from app.service.transcription.window_decode import (
    TOGETHER_KV_BYTES,
    DecodedWindow,
    WindowPlan,
    file_plan,
    rows_within,
)
from app.service.transcription.windows import encode_window, file_segments, restore_times
from app.service.transcription.words import WindowAudio, add_words, segment_words

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

PROMPT_TOKENS = 223  # the previous text a window is prompted with: n_text_ctx // 2 - 1
MAX_HOTWORD_TOKENS = PROMPT_TOKENS // 2  # the rest stays for the previous text


@dataclass
class _LongForm:
    """One transcription's state across its windows: what it reads (the mel, its options and
    language), where it is (`seek`, in mel frames) and what it carries from window to window
    (the text that prompts the next window, segment ids, the last word's end)."""

    mel: np.ndarray  # [n_mels, content_frames + N_FRAMES]
    content_frames: int
    options: TranscriptionOptions
    language: str
    stats: TranscriptionStats
    cancel: threading.Event | None
    tok: InitVar[Tokenizer]  # encodes the options' initial prompt and hotwords
    first_cross: list[np.ndarray] | None = None  # window 0's, when language detection made it
    stream: TextStream | None = None
    seek: int = 0
    segment_id: int = 0
    all_tokens: list[int] = field(default_factory=list)
    prompt_reset_since: int = 0
    hotwords: list[int] = field(init=False)
    last_speech: float = 0.0  # end of the last word, for word timing
    rng: np.random.Generator = field(init=False)

    def __post_init__(self, tok: Tokenizer) -> None:
        self.rng = np.random.default_rng(self.options.seed)
        prompt, hotwords = self.options.initial_prompt, self.options.hotwords
        if prompt:  # the initial prompt and the hotwords prompt every window
            self.all_tokens.extend(
                tok.encode(" " + prompt.strip()) if isinstance(prompt, str) else prompt
            )
        self.hotwords = tok.encode(" " + hotwords)[:MAX_HOTWORD_TOKENS] if hotwords else []

    @property
    def duration(self) -> float:
        return self.content_frames * HOP_LENGTH / SAMPLE_RATE


class TranscriptionCancelled(Exception):
    """The caller's cancel event was set; the transcription stopped at the next decoder step."""


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
        self.n_text_ctx = sessions.manifest.dims.n_text_ctx
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
                    first_cross = self._encode(mel, 0, content_frames, stats)
                    with stats.timed("language_s"):
                        detection = detect_language(
                            self.sessions,
                            first_cross,
                            self.tokenizer,
                            options.kv_cache,
                            options.languages,
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
        job = _LongForm(
            mel, content_frames, options, language, stats, cancel, self.tokenizer,
            first_cross, stream,
        )  # fmt: skip
        segments = self._generate(job)
        if time_map is not None:
            segments = restore_times(segments, time_map, stats.audio_s)
        return segments, info

    # -- one window, for files and live passes ---------------------------------------------------

    def log_mel(self, audio: np.ndarray, padding: int) -> np.ndarray:
        """f32 [N] 16 kHz -> its log-mel [n_mels, frames], `padding` zeros appended first."""
        return log_mel_spectrogram(lift_quiet(audio), self.n_mels, padding=padding)

    def encode(self, features: np.ndarray) -> list[np.ndarray]:
        """A window's log-mel [n_mels, <= 3000] -> its cross K/V, each [1, H, 1500, Dh]."""
        return encode_window(self.sessions, features)

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
    ) -> DecodedWindow:
        """Decode the window of `cross` (its cross K/V; `audio_s` seconds of audio) by `plan`,
        as openai/whisper's `decode_with_fallback`: its attempts in order until the rule accepts
        one, else the rule's best; one `PrefixMemo` for all; the attempts of one of the plan's
        batches as one decode, each sampling from its own generator (spawned from `rng`).
        on_token gets the tokens of every attempt decoded alone; on_attempt(streams) is called
        before each decode (`WindowPlan.streams`). Raises TranscriptionCancelled once `cancel`
        is set."""
        memo = PrefixMemo()
        results: list[DecodingResult] = []
        for batch in plan.batches(self.together_rows):
            tasks = [
                DecodingTask(
                    self.sessions, cross, self.tokenizer, plan.attempts[i], memo=memo,
                    rng=None if rng is None else rng.spawn(1)[0],
                )
                for i in batch
            ]  # fmt: skip
            if on_attempt is not None:
                on_attempt(plan.streams(batch[0], tasks[0].no_speech_prob()))
            try:
                if len(tasks) == 1:
                    tried = [tasks[0].run(on_token, cancel)]
                else:
                    tried = tasks[0].run_together(tasks[1:], cancel)
            except DecodingCancelled as e:
                raise TranscriptionCancelled(str(e)) from e
            for result in tried:
                results.append(result)
                log.debug(
                    "T=%.1f: %d tokens, avg logprob %.2f, compression %.2f, no-speech %.2f%s",
                    result.temperature, len(result.tokens), result.avg_logprob,
                    result.compression_ratio, result.no_speech_prob,
                    ", looped" if result.looped else "",
                )  # fmt: skip
                if not plan.rule.retry(result):
                    return DecodedWindow(result, plan.verdict(result, audio_s), tuple(results))
        result = plan.rule.best(results)
        return DecodedWindow(result, plan.verdict(result, audio_s), tuple(results))

    def segment_words(
        self, window: WindowAudio, segments: Sequence[Sequence[int]]
    ) -> list[list[Word]]:
        """Each segment's words (`segments`: their tokens), aligned to `window`'s audio."""
        return segment_words(self.sessions, self.tokenizer, window, segments)

    # -- the window loop -------------------------------------------------------------------------

    @staticmethod
    def _check_cancel(cancel: threading.Event | None) -> None:
        if cancel is not None and cancel.is_set():
            raise TranscriptionCancelled("transcription was cancelled")

    def _encode(
        self, mel: np.ndarray, seek: int, content_frames: int, stats: TranscriptionStats
    ) -> list[np.ndarray]:
        size = min(N_FRAMES, content_frames - seek)
        with stats.timed("encoder_s"):
            cross = self.encode(mel[:, seek : seek + max(size, 0)])
        stats.windows += 1
        return cross

    def _generate(self, job: _LongForm) -> Iterator[Segment]:
        """The windows of one transcription, in order; the time spent on each (not the time
        the consumer takes between segments) goes to `stats.total_s`."""
        while job.seek < job.content_frames:
            self._check_cancel(job.cancel)
            with job.stats.timed("total_s"):
                kept = self._window(job)
            yield from kept
        log.info("%s", job.stats.summary())

    def _window(self, job: _LongForm) -> list[Segment]:
        """Decode the window at `job.seek`, advance `job`, and return its segments."""
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
            cross = self._encode(job.mel, seek, job.content_frames, stats)

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
        decoded = self.decode_window(
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
                    pad_to=self.n_text_ctx if options.kv_cache == "static" else None,
                )
                kept, job.last_speech = add_words(
                    kept, self.sessions, tok, window_audio, job.last_speech
                )
        if (
            not options.condition_on_previous_text
            or result.temperature > options.prompt_reset_on_temperature
        ):
            job.prompt_reset_since = len(job.all_tokens)
        return kept
