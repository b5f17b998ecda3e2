"""`POST /v1/audio/transcriptions` with speakers (the route's diarization branch).

One job on the worker pool transcribes with word timing and diarizes (`transcribe_speakers`);
the answer is `diarized_json` (OpenAI's shape), verbose_json / srt / vtt with speakers, or json /
text for the diarizing model name. With `stream=true` each transcript segment's speaker runs are
sent as `transcript.text.segment` events as the segment is finished (those finished before the
speaker turns are known, as soon as they are), then `transcript.text.done`;
a failure before the first event is a plain HTTP error, after it an `error` event.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable

from fastapi import Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from app.api.forms import AudioForm
from app.api.job_http import JobReply, read_upload
from app.api.metrics import Metrics, Stopwatch
from app.api.schemas import LanguageJSON, TextDoneEvent, TextSegmentJSON
from app.api.speaker_form import SpeakerForm
from app.api.speaker_formats import diarized_body
from app.config import Settings
from app.service.diarize.attribution import SpeakerSegment
from app.service.diarize.job import DiarizedResult, LazyDiarizer, transcribe_speakers
from app.service.job_run import JobRun
from app.service.models.manager import ModelManager
from app.service.pool import WorkerPool
from app.service.transcription.jobs import TranscriptionJob, TranscriptionResult
from app.service.voices.registry import VoiceRegistry

TASK = "transcribe"
Runs = tuple[SpeakerSegment, ...]  # a finished transcript segment's speaker runs
NOT_FOR_TRANSLATIONS = (
    "Speakers are only found for transcriptions (/v1/audio/transcriptions), not translations"
)


async def respond(
    request: Request,
    form: AudioForm,
    speakers: SpeakerForm,
    models: ModelManager,
    pool: WorkerPool,
    settings: Settings,
    metrics: Metrics,
    diarizer: LazyDiarizer,
    voices: VoiceRegistry,
    language: str | None,
) -> Response:
    """Transcribe with speakers; the lease on the model lasts until the job is over."""
    clock = Stopwatch()
    lease = await models.acquire(speakers.model)
    try:
        loaded = lease.model
        data = await read_upload(form.file, settings.max_upload_bytes)
        options = form.options(loaded, task=TASK, language=language)  # Rejected: a 400 now
        job = TranscriptionJob(data, options, TASK, max_audio_s=settings.max_audio_s)
        reply = JobReply(request, metrics, loaded.name, TASK, clock, _transcription)

        def work(post: Callable[[Runs], None], cancel: threading.Event) -> DiarizedResult:
            on_runs = post if form.stream else None
            enrolled = voices.known(speakers.job.voices) if speakers.job.voices else ()
            return transcribe_speakers(
                loaded, diarizer.get(), job, speakers.job, cancel, on_runs, enrolled
            )

        run = JobRun(pool, lease, work)
        if not form.stream:
            return await reply.whole(run, lambda result: _format(result, form))
        ids = itertools.count()  # each speaker segment's index in the whole answer
        return await reply.stream(
            run,
            lambda runs: [TextSegmentJSON.of(next(ids), r) for r in runs],
            lambda result: TextDoneEvent(
                text=result.transcription.text,
                languages=LanguageJSON.listed(result.transcription.language),
            ),
        )
    finally:
        lease.release_unless_handed_over()


def _transcription(result: DiarizedResult) -> TranscriptionResult:
    return result.transcription


def _format(result: DiarizedResult, form: AudioForm) -> Response:
    granularities = form.timestamp_granularities or ("segment",)
    body = diarized_body(result, form.response_format, granularities)
    return PlainTextResponse(body) if isinstance(body, str) else JSONResponse(body)
