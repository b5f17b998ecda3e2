"""`POST /v1/audio/transcriptions` with speakers (the route's diarization branch).

One job on the worker pool transcribes with word timing and diarizes (`transcribe_speakers`);
the answer is `diarized_json` (OpenAI's shape), verbose_json / srt / vtt with speakers, or json /
text for the diarizing model name. With `stream=true` each transcript segment's speaker runs are
sent as `transcript.text.segment` events as the segment is finished (those finished before the
speaker turns are known, as soon as they are), then `transcript.text.done`;
a failure before the first event is a plain HTTP error, after it an `error` event.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from concurrent.futures import Future

from fastapi import Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from app.api.errors import APIError
from app.api.forms import AudioForm
from app.api.job_http import (
    SSE_HEADERS,
    Disconnected,
    failure_event,
    job_result,
    outcome,
    read_upload,
    sse,
    until_disconnect,
)
from app.api.metrics import Metrics, Stopwatch
from app.api.schemas import TextDoneEvent, TextSegmentJSON
from app.api.speaker_form import SpeakerForm
from app.api.speaker_formats import diarized_body
from app.config import Settings
from app.service.diarize.attribution import SpeakerSegment
from app.service.diarize.job import DiarizedResult, LazyDiarizer, transcribe_speakers
from app.service.jobs import TranscriptionJob
from app.service.model_leases import Lease
from app.service.model_manager import ModelManager
from app.service.pool import WorkerPool

TASK = "transcribe"
NOT_FOR_TRANSLATIONS = APIError(
    400,
    "Speakers are only found for transcriptions (/v1/audio/transcriptions), not translations",
    param="response_format",
    code="invalid_value",
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
        if form.stream:
            return await _stream(request, lease, job, speakers, diarizer, pool, metrics, clock)
        cancel = threading.Event()
        queued_at = Stopwatch()
        started: list[float] = []

        def work() -> DiarizedResult:
            started.append(queued_at())
            return transcribe_speakers(loaded, diarizer.get(), job, speakers.job, cancel)

        future = pool.submit(work)
        lease.release_after(future)
        try:
            result = await until_disconnect(request, job_result(future, cancel))
        except Disconnected:
            metrics.observe_failure(loaded.name, TASK, "cancelled")
            return Response(status_code=499)
        except Exception as e:
            metrics.observe_failure(loaded.name, TASK, outcome(e))
            raise
        metrics.observe_result(loaded.name, result.transcription, started[0], clock())
        return _format(result, form)
    finally:
        lease.release_unless_handed_over()


def _format(result: DiarizedResult, form: AudioForm) -> Response:
    granularities = form.timestamp_granularities or ("segment",)
    body = diarized_body(result, form.response_format, granularities)
    return PlainTextResponse(body) if isinstance(body, str) else JSONResponse(body)


async def _stream(
    request: Request,
    lease: Lease,
    job: TranscriptionJob,
    speakers: SpeakerForm,
    diarizer: LazyDiarizer,
    pool: WorkerPool,
    metrics: Metrics,
    clock: Stopwatch,
) -> Response:
    """Speaker segments as SSE as the transcript's segments finish (and the speaker turns are
    known: the audio is diarized beside the transcription), then the whole text."""
    loaded = lease.model
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[tuple[SpeakerSegment, ...] | None] = asyncio.Queue()
    cancel = threading.Event()
    queued_at = Stopwatch()
    started: list[float] = []

    def post(runs: tuple[SpeakerSegment, ...] | None) -> None:
        with contextlib.suppress(RuntimeError):  # loop closed at shutdown
            loop.call_soon_threadsafe(events.put_nowait, runs)

    def work() -> DiarizedResult:
        started.append(queued_at())
        return transcribe_speakers(loaded, diarizer.get(), job, speakers.job, cancel, post)

    future: Future[DiarizedResult] = pool.submit(work)
    lease.release_after(future)
    future.add_done_callback(lambda _f: post(None))
    try:
        first = await until_disconnect(request, events.get())
    except (Disconnected, asyncio.CancelledError) as e:
        cancel.set()
        future.cancel()
        metrics.observe_failure(loaded.name, job.task, "cancelled")
        if isinstance(e, asyncio.CancelledError):
            raise
        return Response(status_code=499)
    if first is None and future.exception() is not None:  # failed before any event
        metrics.observe_failure(loaded.name, job.task, outcome(future.exception()))
        raise future.exception()

    async def body() -> AsyncIterator[bytes]:
        metrics.active_streams.inc()
        sent = 0
        runs = first
        try:
            while runs is not None:
                for run in runs:
                    if sent == 0:
                        metrics.first_delta_seconds.labels(loaded.name).observe(clock())
                    yield sse(TextSegmentJSON.of(sent, run))
                    sent += 1
                runs = await events.get()
            try:
                result = future.result()
            except Exception as e:
                yield failure_event(e, loaded.name, job.task, metrics)
                return
            transcription = result.transcription
            metrics.observe_result(loaded.name, transcription, started[0], clock())
            yield sse(TextDoneEvent(text=transcription.text))
        finally:
            metrics.active_streams.dec()
            if not future.done():  # the client went away mid-stream
                cancel.set()
                future.cancel()
                metrics.observe_failure(loaded.name, job.task, "cancelled")

    return StreamingResponse(body(), media_type="text/event-stream", headers=SSE_HEADERS)
