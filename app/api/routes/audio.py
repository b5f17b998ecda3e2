"""`POST /v1/audio/transcriptions` and `/v1/audio/translations` (OpenAI-compatible, multipart).

The upload is decoded and transcribed on a worker thread. With `stream=true` the answer is
Server-Sent Events: one `transcript.text.delta` per decoded token as the worker produces it
(the worker's `on_delta` posts it to the event loop through its `JobRun`), then
`transcript.text.done`; a failure after the stream started is an `error` event (`JobReply`).
A client that disconnects cancels its job (queued: dropped; running: stopped between steps).
Streams decode greedily unless the request sets `beam_size`: with beams, text is final only when
all beams agree, which on short clips is the end of the decode.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from app.api import diarized
from app.api.auth import require_api_key
from app.api.deps import DiarizerDep, MetricsDep, ModelsDep, PoolDep, SettingsDep, VoicesDep
from app.api.forms import AudioForm, audio_form
from app.api.job_http import JobReply, read_upload
from app.api.metrics import Metrics, Stopwatch
from app.api.schemas import (
    ERROR_RESPONSES,
    LanguageJSON,
    TextDeltaEvent,
    TextDoneEvent,
    TranscriptionJSON,
    TranscriptionVerboseJSON,
)
from app.api.speaker_form import SpeakerForm, speaker_form
from app.config import Settings
from app.service.errors import Rejected
from app.service.job_run import JobRun
from app.service.models.leases import Lease
from app.service.models.loaded import LoadedModel
from app.service.models.manager import ModelManager
from app.service.pool import WorkerPool
from app.service.transcription import formats
from app.service.transcription.jobs import TranscriptionJob
from app.service.transcription.jobs import TranscriptionResult as Result
from app.service.transcription.results import Segment

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
    voices: VoicesDep,  # the enrolled voices a request names
    language: Annotated[str | None, Form(description="ISO-639-1 code; default: detect")] = None,
) -> Response:
    """Transcribe audio into the input language."""
    if speakers is not None:  # speakers asked for: app/api/diarized.py
        return await diarized.respond(
            request, form, speakers, models, pool, settings, metrics, diarizer, voices, language
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
        raise Rejected("invalid_value", diarized.NOT_FOR_TRANSLATIONS, param="response_format")
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
    reply = JobReply(request, metrics, loaded.name, task, clock, transcription=_itself)
    if not form.stream:
        run = JobRun(pool, lease, lambda _post, cancel: loaded.start(job, cancel=cancel))
        return await reply.whole(run, lambda result: _format(result, form, loaded))
    timed = job.options.word_timestamps  # a segment's words are sent once it is aligned

    def work(post: Callable[[str | Segment], None], cancel: threading.Event) -> Future[Result]:
        return loaded.start(
            job,
            on_delta=None if timed else post,
            cancel=cancel,
            on_audio=lambda _duration: post(""),  # decoded: the response may start
            on_segment=post if timed else None,
        )

    return await reply.stream(JobRun(pool, lease, work), _deltas, _done)


def _itself(result: Result) -> Result:
    return result


def _format(result: Result, form: AudioForm, loaded: LoadedModel) -> Response:
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
def _deltas(event: str | Segment) -> list[TextDeltaEvent]:
    """A decoded token's text, or (with word timestamps) an aligned segment's words."""
    if isinstance(event, Segment):
        return [TextDeltaEvent(delta=w.word, start=w.start, end=w.end) for w in event.words or ()]
    return [TextDeltaEvent(delta=event)] if event else []


def _done(result: Result) -> TextDoneEvent:
    return TextDoneEvent(text=result.text, languages=LanguageJSON.listed(result.language))
