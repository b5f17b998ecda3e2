"""A transcription with speakers: one blocking job on the worker pool.

The upload is decoded once; the known speakers' reference clips are checked and embedded and the
audio diarized on a thread of its own while it is transcribed with word timing on the worker's;
each transcript segment is split by speaker once it is finished and the speaker turns are known
(`on_segments`, for streaming). The speaker models load on first use
(`LazyDiarizer`, one per server); a server without them refuses diarization with a message saying
how to build them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from app.engine.audio import AudioDecodeError, decode_audio
from app.engine.speakers import SpeakerModelsMissing, TooLittleSpeech, load_speaker_models
from app.runtime.contract import SAMPLE_RATE
from app.runtime.placement import DeviceError, RuntimeOptions
from app.service.diarize.activity import Turn
from app.service.diarize.attribution import (
    FIRST,
    SpeakerSegment,
    speaker_segments,
    word_speaker,
)
from app.service.diarize.beside import HeldSegments, Stop, beside
from app.service.diarize.clustering import SpeakerHints
from app.service.diarize.pipeline import DiarizationOptions, Diarizer
from app.service.errors import Rejected
from app.service.models.loaded import LoadedModel
from app.service.transcription.jobs import TranscriptionJob, TranscriptionResult
from app.service.transcription.results import Segment

log = logging.getLogger(__name__)

# intra-op threads of each speaker model: they run beside Whisper, whose decoder loop leaves a core
# free part of the time, not all of it (2 cores: benchmarks/results/diarization_e2e.md)
SPEAKER_THREADS = 1
REFERENCE_S = (2.0, 10.0)  # OpenAI's bounds on a known speaker's reference clip
REFERENCES_PARAM = "known_speaker_references[]"


@dataclass(frozen=True)
class SpeakerJob:
    """What a request asks of diarization: count hints, known speakers (each a name and its
    reference clip, f32 16 kHz mono: `known_clips` checks and decodes them) and the names of
    enrolled voices (`app.service.voices`)."""

    hints: SpeakerHints = field(default_factory=SpeakerHints)
    known: tuple[tuple[str, np.ndarray], ...] = ()
    voices: tuple[str, ...] = ()


@dataclass(frozen=True)
class DiarizedResult:
    """A transcription, the speaker turns found in its audio and each cluster's label."""

    transcription: TranscriptionResult
    turns: tuple[Turn, ...]
    labels: dict[int, str]

    @property
    def segments(self) -> tuple[SpeakerSegment, ...]:
        return speaker_segments(self.transcription.segments, self.turns, self.labels)

    def speaker_at(self, start: float, end: float) -> str:
        """The label of whoever talks most in [start, end] (seconds)."""
        return self.labels.get(word_speaker(start, end, self.turns), FIRST)


class LazyDiarizer:
    """The diarizer over `<models_dir>/diarization`, loaded by the first request that needs it
    (thread-safe: concurrent first requests load it once) on `runtime`'s device with
    `threads` threads per model. `get` raises `Rejected` (unavailable) while the models are not
    built; a later build is picked up."""

    def __init__(
        self,
        models_dir: Path,
        runtime: RuntimeOptions,
        options: DiarizationOptions | None = None,
        threads: int = SPEAKER_THREADS,
    ) -> None:
        self._models_dir = models_dir
        self._runtime = replace(runtime, threads=threads)
        self._options = options or DiarizationOptions()
        self._lock = threading.Lock()
        self._diarizer: Diarizer | None = None

    def get(self) -> Diarizer:
        """The diarizer, loaded now if it is not yet (blocking: call it on a worker thread)."""
        with self._lock:
            if self._diarizer is None:
                self._diarizer = self._load()
            return self._diarizer

    def _load(self) -> Diarizer:
        started = time.perf_counter()
        try:
            step_s = self._options.step_s
            models = load_speaker_models(self._models_dir, self._runtime, step_s=step_s)
        except (SpeakerModelsMissing, DeviceError) as e:
            missing = isinstance(e, SpeakerModelsMissing)
            reason = f"the diarization models are not built ({e})" if missing else str(e)
            raise Rejected(
                "diarization_unavailable",
                f"Speaker diarization is not available on this server: {reason}",
                kind="unavailable",
            ) from e
        log.info("speaker models loaded in %.2f s", time.perf_counter() - started)
        return Diarizer(models, self._options)


def reference_clip(data: bytes, index: int) -> np.ndarray:
    """A known speaker's reference clip decoded and checked (2-10 s of audio)."""
    where = f"known_speaker_references[{index}]"
    try:
        clip = decode_audio(data, SAMPLE_RATE)
    except AudioDecodeError as e:
        raise Rejected("invalid_value", f"{where} is not audio this server can read: {e}",
                       param=REFERENCES_PARAM) from e  # fmt: skip
    return lasting(clip, REFERENCE_S, where, REFERENCES_PARAM)


def lasting(clip: np.ndarray, bounds: tuple[float, float], what: str, param: str) -> np.ndarray:
    """`clip` if it lasts within `bounds` (seconds); else a 400 saying how long `what` lasts."""
    seconds = len(clip) / SAMPLE_RATE
    low, high = bounds
    if not low <= seconds <= high:
        raise Rejected(
            "invalid_value",
            f"{what} lasts {seconds:.1f} s; it must last {low:g} to {high:g} s",
            param=param,
        )
    return clip


def known_clips(known: Sequence[tuple[str, bytes]]) -> tuple[tuple[str, np.ndarray], ...]:
    """Each known speaker's name and reference clip, decoded and checked."""
    return tuple((name, reference_clip(data, i)) for i, (name, data) in enumerate(known))


def known_embeddings(
    diarizer: Diarizer, known: Sequence[tuple[str, np.ndarray]]
) -> list[tuple[str, np.ndarray]]:
    """Each known speaker's name and the embedding of its reference clip."""
    found = []
    for index, (name, clip) in enumerate(known):
        try:
            found.append((name, diarizer.reference(clip)))
        except TooLittleSpeech as e:
            raise Rejected("invalid_value", f"known_speaker_references[{index}] holds no speech",
                           param=REFERENCES_PARAM) from e  # fmt: skip
    return found


def transcribe_speakers(
    model: LoadedModel,
    diarizer: Diarizer,
    job: TranscriptionJob,
    speakers: SpeakerJob,
    cancel: threading.Event | None = None,
    on_segments: Callable[[tuple[SpeakerSegment, ...]], None] | None = None,
    enrolled: Sequence[tuple[str, np.ndarray]] = (),
) -> DiarizedResult:
    """Transcribe `job` with word timing and say who spoke each word (blocking); `enrolled`:
    the embeddings of the enrolled voices `speakers` names.

    The speaker pass (known speakers' clips, then the audio) runs on a thread of its own beside
    the transcription, which runs on the calling thread: Whisper's decoder loop leaves a core
    free much of the time. Segments finished before the speaker turns are known are held and go
    to `on_segments` in order as soon as they are. `cancel` stops both; either failing stops the
    other and its error is raised; the call returns once both have ended."""
    job = replace(job, options=replace(job.options, word_timestamps=True))
    audio = decode_audio(job.audio, SAMPLE_RATE, max_duration_s=job.max_audio_s)
    stop = Stop(cancel)
    held: HeldSegments[Segment, tuple[SpeakerSegment, ...]] = HeldSegments(
        on_segments or (lambda _runs: None)
    )

    def speaker_pass() -> tuple[tuple[Turn, ...], dict[int, str]]:
        known = known_embeddings(diarizer, speakers.known) + list(enrolled)
        started = time.perf_counter()
        diarization = diarizer(audio, speakers.hints, stop)
        labels = diarization.labels(known, diarizer.options.known_threshold)
        log.info("diarized %.1f s in %.2f s: %d speakers, %d turns", len(audio) / SAMPLE_RATE,
                 time.perf_counter() - started, len(labels), len(diarization.turns))  # fmt: skip
        held.release(lambda segment: speaker_segments([segment], diarization.turns, labels))
        return diarization.turns, labels

    def transcription() -> TranscriptionResult:
        listen = held.add if on_segments is not None else None
        return model.start_samples(audio, job, cancel=stop, on_segment=listen).result()

    result, (turns, labels) = beside(transcription, speaker_pass, stop, name="speakers")
    return DiarizedResult(result, turns, labels)
