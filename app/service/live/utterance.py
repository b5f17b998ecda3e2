"""One spoken command, transcribed whole: what a voice assistant acts on (the Wyoming protocol).

A live session (`LiveRunner`) streams words while the person speaks, but its commits are
irrevocable guesses made on partial audio. The text a voice assistant acts on is better taken
from the whole utterance, transcribed as an uploaded file is. That pass starts early:

    audio arrives      -> converted to f32 16 kHz once (the runner's converter), kept (up to
                          `max_s`; longer: no whole pass, the live text stands)
    ... as spoken      -> to the live session at real-time pace; its VAD hears it at once
                          (`VoiceActivity` events, while the session's passes decode)
    speaker pauses     -> (a pause: `PAUSE_S` of silence after speech, the session's `pause_s`
                          on Wyoming) a whole pass starts on the audio received so far, on
                          the shared worker pool
    speaker goes on    -> (speech starts again) that pass is dropped
    the client stops   -> the rest of the audio reaches the VAD at once; if no speech started
                          after the pause, the early pass is the transcript: usually finished
                          already, since a client stops only after hearing some silence;
                          else a whole pass over everything. (A session without VAD:
                          STT_VAD_FILTER off or no model, has no early pass.)

The pause that starts the pass is shorter than the live session's turn end (its VAD's
`min_silence_s`, 0.5 s): a client that stops soon after the speech ends (a recording's own
trailing silence, a voice assistant's end-of-speech detection) finds the pass started
already. A pause inside the command costs one dropped pass (a queued one costs nothing). Each
chunk is converted once and heard by one VAD (the session's). The session hears the audio at
real-time pace (`RealTimeFeed`), not as it arrives: a recording sent in one burst has no pauses
in time, and passes started at each of its pauses would be work wasted against the one pass the
client waits for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np

from app.runtime.contract import SAMPLE_RATE
from app.service.job_run import JobRun
from app.service.live.events import VoiceActivity
from app.service.live.pacing import RealTimeFeed
from app.service.live.runner import LiveRunner
from app.service.models.loaded import LoadedModel
from app.service.pool import WorkerPool
from app.service.transcription.jobs import TranscriptionJob, TranscriptionResult

log = logging.getLogger(__name__)

PAUSE_S = 0.2  # silence after speech that starts the early whole pass


@dataclass
class _Early:
    task: asyncio.Task[TranscriptionResult]
    upto: int  # samples of the recording it transcribes


class Utterance:
    """One utterance: its live session, its audio and its whole-utterance transcription; event
    loop only."""

    def __init__(
        self,
        runner: LiveRunner,
        model: LoadedModel,
        pool: WorkerPool,
        job: TranscriptionJob,
        max_s: float,
    ) -> None:
        self.runner, self.model, self.pool, self.job = runner, model, pool, job
        self._recorded: list[np.ndarray] | None = []  # f32 16 kHz pieces
        self._samples = 0
        self._limit = round(max_s * SAMPLE_RATE)
        self._early: _Early | None = None
        self._paused = False  # the current silence started a pass
        self._feed = RealTimeFeed(runner.feed, SAMPLE_RATE)

    def add(self, data: bytes) -> None:
        """The client's PCM as it arrives. Raises AudioDecodeError (the chunk is dropped) or
        the limit the live session passed meanwhile (`Rejected`)."""
        samples = self.runner.convert(data)  # the one conversion
        self._feed.check()
        self._feed.put(samples)
        if self._recorded is None:
            return
        if self._samples + samples.shape[0] > self._limit:
            self._recorded = None  # too long to hold: the live text will be the transcript
            self._drop_early()
        else:
            self._recorded.append(samples)
            self._samples += samples.shape[0]

    def voice(self, event: VoiceActivity) -> None:
        """The session's VAD heard speech start or resume, or a pause (then the speech's end)."""
        if self._recorded is None:
            return
        if event.kind in ("start", "resume"):
            self._paused = False
            self._drop_early()  # the speaker goes on
        elif not self._paused:
            self._paused = True
            self._speech_stopped()

    def _speech_stopped(self) -> None:
        """The speaker paused: transcribe what was said so far, in case that was all."""
        self._drop_early()
        if self._samples:
            audio = self._audio()
            self._early = _Early(asyncio.ensure_future(self._whole(audio)), audio.shape[0])

    def recording(self) -> np.ndarray | None:
        """The utterance's audio so far (f32 16 kHz); None once it was too long to hold."""
        return None if self._recorded is None else self._audio()

    async def finish(self) -> tuple[str, str | None]:
        """The client stopped: the transcript's text and language. The whole utterance's
        transcription; the live session's text when it was too long to hold."""
        if self._recorded is None:
            self._feed.flush()
            text = (await self.runner.close()).strip()
            return text, self.job.options.language
        self._feed.flush()  # no pace to keep: did the speaker go on after the pause?
        await self._feed.stop()
        await self.runner.heard()
        await self.runner.stop()  # the whole-utterance pass covers everything
        result = await self._transcript()
        return result.text, result.language

    async def _transcript(self) -> TranscriptionResult:
        audio, early = self._audio(), self._early
        if early is not None:
            log.info(
                "utterance: the pass started at the pause answers (%.2f s of silence after it)",
                (audio.shape[0] - early.upto) / SAMPLE_RATE,
            )
            return await early.task
        return await self._whole(audio)

    async def close(self) -> None:
        """Stop the feed, the live session and the early pass (an awaited pass stops with its
        caller)."""
        await self._feed.stop()
        self._drop_early()
        await self.runner.stop()

    # ---- internals ----------------------------------------------------------------------
    def _audio(self) -> np.ndarray:
        pieces = self._recorded or []
        if len(pieces) > 1:
            pieces[:] = [np.concatenate(pieces)]
        return pieces[0] if pieces else np.zeros(0, np.float32)

    async def _whole(self, audio: np.ndarray) -> TranscriptionResult:
        """A pass on the worker pool; cancelling the awaiting task stops it."""
        job, model = self.job, self.model

        def work(_post: object, cancel: threading.Event) -> Future[TranscriptionResult]:
            return model.start_samples(audio, job, cancel)

        return await JobRun(self.pool, None, work).result()

    def _drop_early(self) -> None:
        early, self._early = self._early, None
        if early is not None:
            early.task.cancel()
            early.task.add_done_callback(_consume)


def _consume(task: asyncio.Task) -> None:
    """A dropped pass's outcome is not wanted (not even its error)."""
    with contextlib.suppress(BaseException):
        task.exception()
