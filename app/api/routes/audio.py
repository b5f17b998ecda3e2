"""`POST /v1/audio/transcriptions` and `/v1/audio/translations` (OpenAI-compatible, multipart).

The upload is decoded and transcribed on a worker thread. With `stream=true` the answer is
Server-Sent Events: one `transcript.text.delta` per decoded token as the worker produces it
(the worker's `on_delta` callback hops onto the event loop through `call_soon_threadsafe`),
then `transcript.text.done`; a failure after the stream started is an `error` event.
A client that disconnects cancels its job (queued: dropped; running: stopped between steps).
Streams decode greedily unless the request sets `beam_size`: with beams, text is final only when
all beams agree, which on short clips is the end of the decode.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator
from concurrent.futures import Future
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from app.api import diarized
from app.api.auth import require_api_key
from app.api.deps import DiarizerDep, MetricsDep, ModelsDep, PoolDep, SettingsDep
from app.api.forms import AudioForm, audio_form
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
from app.api.schemas import (
    ERROR_RESPONSES,
    TextDeltaEvent,
    TextDoneEvent,
    TranscriptionJSON,
    TranscriptionVerboseJSON,
)
from app.api.speaker_form import SpeakerForm, speaker_form
from app.config import Settings
from app.service import formats
from app.service.jobs import TranscriptionJob, TranscriptionResult
from app.service.model_leases import Lease
from app.service.model_manager import ModelManager
from app.service.pool import WorkerPool
from app.service.registry import LoadedModel
from app.service.results import Segment

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/audio", tags=["audio"], dependencies=[Depends(require_api_key)])

Task = Literal["transcribe", "translate"]

_RESPONSES: dict[int | str, dict[str, object]] = {
    200: {
        "description": "json / verbose_json as JSON; text, srt and vtt as text/plain; "
        "with stream=true, text/event-stream",
        "content": {
            "application/json": {},
            "text/plain": {},
            "text/event-stream": {},
        },
    },
    **ERROR_RESPONSES,
}


# ---- endpoints --------------------------------------------------------------------------------
@router.post("/transcriptions", response_model=None, responses=_RESPONSES)
async def create_transcription(
    request: Request,
    form: Annotated[AudioForm, Depends(audio_form)],
    models: ModelsDep,
    pool: PoolDep,
    settings: SettingsDep,
    metrics: MetricsDep,
    speakers: Annotated[SpeakerForm | None, Depends(speaker_form)],
    diarizer: DiarizerDep,  # diarization: the speaker models, loaded on first use
    language: Annotated[str | None, Form(description="ISO-639-1 code; default: detect")] = None,
) -> Response:
    """Transcribe audio into the input language."""
    if speakers is not None:  # speakers asked for: app/api/diarized.py
        return await diarized.respond(
            request, form, speakers, models, pool, settings, metrics, diarizer, language
        )
    return await _handle(
        request, form, models, pool, settings, metrics, task="transcribe", language=language
    )


@router.post("/translations", response_model=None, responses=_RESPONSES)
async def create_translation(
    request: Request,
    form: Annotated[AudioForm, Depends(audio_form)],
    models: ModelsDep,
    pool: PoolDep,
    settings: SettingsDep,
    metrics: MetricsDep,
    speakers: Annotated[SpeakerForm | None, Depends(speaker_form)],
) -> Response:
    """Translate audio into English."""
    if speakers is not None:
        raise diarized.NOT_FOR_TRANSLATIONS
    return await _handle(
        request, form, models, pool, settings, metrics, task="translate", language=None
    )


# ---- shared path ------------------------------------------------------------------------------
async def _handle(
    request: Request,
    form: AudioForm,
    models: ModelManager,
    pool: WorkerPool,
    settings: Settings,
    metrics: Metrics,
    *,
    task: Task,
    language: str | None,
) -> Response:
    """The request holds a lease on its model until its job is over (an unload waits)."""
    clock = Stopwatch()
    lease = await models.acquire(form.model)
    try:
        return await _transcribe(
            request, form, lease, pool, settings, metrics, clock, task=task, language=language
        )
    finally:
        lease.release_unless_handed_over()


async def _transcribe(
    request: Request,
    form: AudioForm,
    lease: Lease,
    pool: WorkerPool,
    settings: Settings,
    metrics: Metrics,
    clock: Stopwatch,
    *,
    task: Task,
    language: str | None,
) -> Response:
    loaded = lease.model
    data = await read_upload(form.file, settings.max_upload_bytes)
    options = form.options(loaded, task=task, language=language)  # Rejected: a 400 now
    job = TranscriptionJob(data, options, task, max_audio_s=settings.max_audio_s)
    if form.stream:
        return await _stream(request, lease, job, pool, metrics, clock)

    cancel = threading.Event()
    queued_at = Stopwatch()
    started: list[float] = []

    def work() -> TranscriptionResult:
        started.append(queued_at())
        return loaded.transcribe(job, cancel=cancel)

    future = pool.submit(work)  # QueueFullError -> 429
    lease.release_after(future)
    try:
        result = await until_disconnect(request, job_result(future, cancel))
    except Disconnected:
        log.info("client disconnected; %s job on %s cancelled", task, loaded.name)
        metrics.observe_failure(loaded.name, task, "cancelled")
        return Response(status_code=499)
    except Exception as e:
        metrics.observe_failure(loaded.name, task, outcome(e))
        raise
    metrics.observe_result(loaded.name, result, started[0] if started else 0.0, clock())
    return _format(result, form, loaded)


def _format(result: TranscriptionResult, form: AudioForm, loaded: LoadedModel) -> Response:
    match form.response_format:
        case "json":
            token_bytes = loaded.tokenizer.token_bytes if "logprobs" in form.include else None
            body = TranscriptionJSON.from_result(result, token_bytes)
            return JSONResponse(body.model_dump(exclude_none=True))
        case "verbose_json":
            granularities = form.timestamp_granularities or ("segment",)
            body = TranscriptionVerboseJSON.from_result(result, granularities)
            return JSONResponse(body.model_dump(exclude_none=True))
        case "text":
            return PlainTextResponse(result.text + "\n")
        case "srt":
            return PlainTextResponse(formats.to_srt(result.segments))
        case "vtt":
            return PlainTextResponse(formats.to_vtt(result.segments))


# ---- SSE ----------------------------------------------------------------------------------------
async def _stream(
    request: Request,
    lease: Lease,
    job: TranscriptionJob,
    pool: WorkerPool,
    metrics: Metrics,
    clock: Stopwatch,
) -> Response:
    """Stream the job's tokens as SSE.

    The job is submitted first, so a full queue is still a plain 429, and the response starts
    only once the upload has decoded, so bad audio is still a plain 415/413. After that, errors
    become an `error` event. Closing the connection cancels the job.
    """
    loaded = lease.model
    loop = asyncio.get_running_loop()
    events: asyncio.Queue[tuple[str, str | Segment | None]] = asyncio.Queue()
    cancel = threading.Event()
    queued_at = Stopwatch()
    started: list[float] = []

    def post(kind: str, payload: str | Segment | None) -> None:
        with contextlib.suppress(RuntimeError):  # loop closed at shutdown
            loop.call_soon_threadsafe(events.put_nowait, (kind, payload))

    def work() -> TranscriptionResult:
        started.append(queued_at())
        # with word timestamps a segment's words are sent once its window is aligned
        timed = job.options.word_timestamps
        return loaded.transcribe(
            job,
            on_delta=None if timed else lambda text: post("delta", text),
            cancel=cancel,
            on_audio=lambda _duration: post("audio", None),
            on_segment=(lambda segment: post("segment", segment)) if timed else None,
        )

    future: Future[TranscriptionResult] = pool.submit(work)  # QueueFullError -> 429
    lease.release_after(future)
    future.add_done_callback(lambda _f: post("end", None))

    try:
        kind, _ = await until_disconnect(request, events.get())
    except (Disconnected, asyncio.CancelledError) as e:
        cancel.set()
        future.cancel()
        metrics.observe_failure(loaded.name, job.task, "cancelled")
        log.info("stream client disconnected while queued; job on %s cancelled", loaded.name)
        if isinstance(e, asyncio.CancelledError):
            raise
        return Response(status_code=499)
    if kind == "end":  # failed before any audio was decoded: a plain HTTP error
        try:
            future.result()
        except Exception as e:
            metrics.observe_failure(loaded.name, job.task, outcome(e))
            raise
        raise RuntimeError("transcription ended without decoding audio")  # not reached

    async def body() -> AsyncIterator[bytes]:
        metrics.active_streams.inc()
        first = True
        try:
            while True:
                kind, payload = await events.get()
                if kind == "end":
                    break
                deltas = []
                if kind == "delta" and isinstance(payload, str) and payload:
                    deltas = [TextDeltaEvent(delta=payload)]
                elif kind == "segment" and isinstance(payload, Segment):
                    deltas = [
                        TextDeltaEvent(delta=w.word, start=w.start, end=w.end)
                        for w in payload.words or ()
                    ]
                for delta in deltas:
                    if first:
                        metrics.first_delta_seconds.labels(loaded.name).observe(clock())
                        first = False
                    yield sse(delta, compact=True)
            try:
                result = future.result()
            except Exception as e:
                yield failure_event(e, loaded.name, job.task, metrics)
                return
            metrics.observe_result(loaded.name, result, started[0] if started else 0.0, clock())
            yield sse(TextDoneEvent(text=result.text))
        finally:
            metrics.active_streams.dec()
            if not future.done():  # the client went away mid-stream
                cancel.set()
                future.cancel()
                metrics.observe_failure(loaded.name, job.task, "cancelled")
                log.info("stream client disconnected; job on %s cancelled", loaded.name)

    return StreamingResponse(body(), media_type="text/event-stream", headers=SSE_HEADERS)
