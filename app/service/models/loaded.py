"""A loaded model: its sessions, tokenizer and transcriber, and the job it runs.

`LoadedModel.start` is the job the worker pool runs for one request: decode the upload, check
its length, and start its transcription with the options the job carries (built at the edge that
took the request) as one task on the model (its segments and timings collected at its end).
Loading, unloading and leases are `app.service.models.manager`'s.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace

import numpy as np

from app.engine.audio import AudioDecodeError, AudioTooLongError, decode_audio
from app.engine.backend import WhisperBackend
from app.engine.languages import LANGUAGES
from app.engine.tokenizer import Tokenizer
from app.engine.vad import SileroVad
from app.runtime.contract import SAMPLE_RATE
from app.runtime.steps import Steps
from app.service.batching.scheduler import BatchingSessions
from app.service.transcription.jobs import ModelInfo, TranscriptionJob, TranscriptionResult
from app.service.transcription.transcriber import (
    Segment,
    Transcriber,
    TranscriptionCancelled,
    TranscriptionOptions,
)

# what `LoadedModel.start` raises (or its future ends with) besides the model's own failures
__all__ = ["AudioDecodeError", "AudioTooLongError", "LoadedModel", "TranscriptionCancelled"]

log = logging.getLogger(__name__)

WARMUP_SECONDS = 1.0


class LoadedModel:
    """One model folder ready to transcribe: sessions, tokenizer, transcriber."""

    def __init__(
        self,
        name: str,
        sessions: WhisperBackend,
        tokenizer: Tokenizer,
        base_options: TranscriptionOptions,
        load_s: float,
        created: int,
        vad: SileroVad | None = None,
    ) -> None:
        self.name = name
        self.sessions: WhisperBackend = sessions
        self.tokenizer = tokenizer
        self.transcriber = Transcriber(sessions, tokenizer, vad=vad)
        self.vad_available = vad is not None
        # the server's defaults for a request; without a VAD model the vad_filter default is off
        self.base_options = (
            base_options if vad is not None else replace(base_options, vad_filter=False)
        )
        self.multilingual = bool(sessions.manifest.multilingual)
        self._load_s = load_s
        self._warmup_s = 0.0
        self._created = created
        self.memory_bytes: int | None = None  # RSS growth across load + warm-up

    @property
    def scheduler(self) -> BatchingSessions | None:
        """The batching scheduler of this model (None when batching is off)."""
        return self.sessions if isinstance(self.sessions, BatchingSessions) else None

    def close(self) -> None:
        """Stop the batching scheduler (its pending calls are served first); the sessions are
        freed with the last reference to this object."""
        if self.scheduler is not None:
            self.scheduler.close()

    @property
    def info(self) -> ModelInfo:
        return ModelInfo(
            name=self.name,
            multilingual=self.multilingual,
            devices=dict(self.sessions.devices),
            arithmetic=dict(self.sessions.arithmetic),
            load_s=round(self._load_s, 3),
            warmup_s=round(self._warmup_s, 3),
            created=self._created,
            memory_bytes=self.memory_bytes,
        )

    def start(
        self,
        job: TranscriptionJob,
        on_delta: Callable[[str], None] | None = None,
        cancel: threading.Event | None = None,
        on_audio: Callable[[float], None] | None = None,
        on_segment: Callable[[Segment], None] | None = None,
    ) -> Future[TranscriptionResult]:
        """Decode and check one upload here (blocking: run it on a worker thread), then start
        its transcription: the VAD and the mel here too, its model work on the model's
        scheduler (this thread is free once the first model call is queued) or here without
        one. Its future ends with the result.

        `on_audio(duration_s)` is called once the upload decoded fine, before transcription
        starts; `on_delta(text)` for every decoded token; `on_segment(segment)` for every
        segment as it is finished (with its words when they are timed); these may run on the
        scheduler's threads. Raises `AudioDecodeError` (incl. `AudioTooLongError`), or ends
        with `TranscriptionCancelled` once `cancel` is set.
        """
        if cancel is not None and cancel.is_set():
            raise TranscriptionCancelled("cancelled before start")
        t0 = time.perf_counter()
        audio = decode_audio(job.audio, SAMPLE_RATE, max_duration_s=job.max_audio_s)  # f32 [N]
        if on_audio is not None:
            on_audio(audio.shape[0] / SAMPLE_RATE)
        return self.sessions.start(
            self._transcription(audio, job, t0, on_delta, cancel, on_segment)
        )

    def start_samples(
        self,
        audio: np.ndarray,
        job: TranscriptionJob,
        cancel: threading.Event | None = None,
        on_segment: Callable[[Segment], None] | None = None,
    ) -> Future[TranscriptionResult]:
        """`start` for audio already decoded (f32 16 kHz mono, as a live protocol holds it);
        `job.audio` is not read."""
        steps = self._transcription(audio, job, time.perf_counter(), None, cancel, on_segment)
        return self.sessions.start(steps)

    def _transcription(
        self,
        audio: np.ndarray,
        job: TranscriptionJob,
        t0: float,
        on_delta: Callable[[str], None] | None,
        cancel: threading.Event | None,
        on_segment: Callable[[Segment], None] | None,
    ) -> Steps[TranscriptionResult]:
        """The transcription of f32 16 kHz samples decoded since `t0`, as a resumable task."""
        options = job.options
        t1 = time.perf_counter()
        collected, info = yield from self.transcriber.transcription(
            audio, options, on_delta, cancel, on_segment
        )
        t2 = time.perf_counter()
        duration = audio.shape[0] / SAMPLE_RATE
        language = info.language or (options.language or "en")
        result = TranscriptionResult(
            segments=collected,
            info=info,
            text="".join(s.text for s in collected).strip(),
            language=language,
            language_name=LANGUAGES.get(language, language),
            duration_s=duration,
            task=job.task,
            timings={
                "decode_audio": t1 - t0,
                "vad": info.stats.vad_s,
                "mel": info.stats.mel_s,
                "encoder": info.stats.encoder_s,
                "language": info.stats.language_s,
                "decoder": info.stats.prefill_s + info.stats.decoder_s,
                "search": info.stats.search_s,
                "transcribe": t2 - t1,
            },
        )
        log.info(
            "%s %s: %.2f s audio, decode %.1f ms, transcribe %.3f s (RTF %.3f), %d segments",
            self.name,
            job.task,
            duration,
            (t1 - t0) * 1e3,
            t2 - t1,
            result.rtf,
            len(collected),
        )
        return result

    def warm_up(self) -> float:
        """Transcribe 1 s of faint noise once so the first request pays no compile cost (VAD
        off: it would find no speech and nothing would be decoded)."""
        t0 = time.perf_counter()
        rng = np.random.default_rng(0)
        noise = (rng.standard_normal(int(WARMUP_SECONDS * SAMPLE_RATE)) * 1e-3).astype(np.float32)
        options = replace(self.base_options, vad_filter=False)
        segments, _ = self.transcriber.transcribe(noise, options)
        for _ in segments:
            pass
        self._warmup_s = time.perf_counter() - t0
        return self._warmup_s
