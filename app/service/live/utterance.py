"""One spoken command, transcribed whole: what a voice assistant acts on (the Wyoming protocol).

A live session streams words while the person speaks, but its commits are irrevocable guesses
made on partial audio. The text a voice assistant acts on is better taken from the whole
utterance, transcribed as an uploaded file is. That pass starts early:

    audio arrives      -> kept (up to `max_s`; longer: no whole pass, the live text stands)
    ... as spoken      -> (`heard`: the audio at real-time pace, as the live session gets it)
    speaker pauses     -> (`PAUSE_S` of silence after speech, by the utterance's own VAD
                          stream) a whole pass starts on the audio received so far, on the
                          shared worker pool
    speaker goes on    -> that pass is dropped
    the client stops   -> if nothing but silence came after the pause (checked by the VAD on
                          that tail), the early pass is the transcript: usually finished
                          already, since a client stops only after hearing some silence;
                          else a whole pass over everything.

The pause that starts the pass is shorter than the live session's turn end (its VAD's
`min_silence_s`, 0.5 s): a client that stops soon after the speech ends (a recording's own
trailing silence, a voice assistant's end-of-speech detection) finds the pass started
already. A pause inside the command costs one dropped pass (a queued one costs nothing). The
detector runs on the event loop as audio is heard: one Silero call per 32 ms chunk (~0.15 ms).
It hears the audio at real-time pace (`RealTimeFeed`), not as it arrives: a recording sent in
one burst has no pauses in time, and passes started at each of its pauses would be work
wasted against the one pass the client waits for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from dataclasses import dataclass

import numpy as np

from app.engine.vad import SileroVad, VadOptions, VadStream
from app.service.jobs import TranscriptionJob, TranscriptionResult
from app.service.live.pcm import FramedPcm
from app.service.pool import WorkerPool
from app.service.registry import LoadedModel

log = logging.getLogger(__name__)

PAUSE_S = 0.2  # silence after speech that starts the early whole pass


@dataclass(frozen=True)
class UtteranceFormat:
    """How the client's PCM is framed: `rate` Hz, `width` bytes per sample, `channels`."""

    rate: int
    width: int
    channels: int

    @property
    def bytes_per_s(self) -> int:
        return self.rate * self.width * self.channels

    def to_float(self, data: bytes) -> np.ndarray:
        """f32 16 kHz mono samples of whole frames."""
        framed = FramedPcm(self.rate, self.width, self.channels)
        return np.concatenate([framed.convert(data), framed.finish()])


@dataclass
class _Early:
    task: asyncio.Task[TranscriptionResult]
    upto: int  # bytes of the recording it transcribes


class Utterance:
    """The audio of one utterance and its whole-utterance transcription; event loop only."""

    def __init__(
        self,
        model: LoadedModel,
        pool: WorkerPool,
        vad: SileroVad | None,
        fmt: UtteranceFormat,
        job: TranscriptionJob,
        max_s: float,
    ) -> None:
        self.model, self.pool, self.vad, self.fmt, self.job = model, pool, vad, fmt, job
        self.recorded: bytearray | None = bytearray()
        self.limit = int(max_s * fmt.rate) * fmt.width * fmt.channels
        self._early: _Early | None = None
        self._pcm = FramedPcm(fmt.rate, fmt.width, fmt.channels)  # the detector's 16 kHz view
        self._pauses = (
            VadStream(vad, VadOptions(min_silence_s=PAUSE_S)) if vad is not None else None
        )

    def add(self, data: bytes) -> None:
        """Whole frames of the client's PCM (checked by the caller), as they arrive."""
        if self.recorded is None:
            return
        if len(self.recorded) + len(data) > self.limit:
            self.recorded = None  # too long to hold: the live text will be the transcript
            self._drop_early()
        else:
            self.recorded += data

    def heard(self, data: bytes) -> None:
        """The same audio again, at the pace it was spoken: watched for pauses."""
        if self._pauses is None or self.recorded is None:
            return
        for event in self._pauses.feed(self._pcm.convert(data)):
            if event.kind == "end":
                self._speech_stopped()
            else:
                self._drop_early()  # the speaker goes on

    def _speech_stopped(self) -> None:
        """The speaker paused: transcribe what was said so far, in case that was all."""
        self._drop_early()
        data = bytes(self.recorded or b"")
        if data:
            self._early = _Early(asyncio.ensure_future(self._whole(data)), len(data))

    async def transcript(self) -> TranscriptionResult | None:
        """The whole utterance's transcription (None when it was too long to hold)."""
        if self.recorded is None:
            return None
        early = self._early
        tail = bytes(self.recorded[early.upto :]) if early is not None else b""
        if early is not None and not self._speech_in(tail):
            log.info(
                "utterance: the pass started at the pause answers (%.2f s of silence after it)",
                len(tail) / self.fmt.bytes_per_s,
            )
            return await early.task
        self._drop_early()
        return await self._whole(bytes(self.recorded))

    def close(self) -> None:
        """Stop the early pass (the connection ended; an awaited pass stops with its caller)."""
        self._drop_early()

    # ---- internals ----------------------------------------------------------------------
    async def _whole(self, data: bytes) -> TranscriptionResult:
        """A pass on the worker pool; cancelling the awaiting task stops it (its own event)."""
        fmt, job, model = self.fmt, self.job, self.model
        cancel = threading.Event()

        def work() -> TranscriptionResult:
            return model.transcribe_samples(fmt.to_float(data), job, cancel)

        return await self.pool.run(work, cancel)

    def _speech_in(self, tail: bytes) -> bool:
        """Whether the audio after the pause holds speech (no VAD: assume it does)."""
        if not tail:
            return False
        if self.vad is None:
            return True
        probs = self.vad.probs(self.fmt.to_float(tail))
        return bool(np.any(probs >= VadOptions().threshold))

    def _drop_early(self) -> None:
        early, self._early = self._early, None
        if early is not None:
            early.task.cancel()
            early.task.add_done_callback(_consume)


def _consume(task: asyncio.Task) -> None:
    """A dropped pass's outcome is not wanted (not even its error)."""
    with contextlib.suppress(BaseException):
        task.exception()
