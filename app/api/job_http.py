"""The HTTP side of a job run (`app.service.job_run.JobRun`), shared by the audio routes: reading
the upload, and `JobReply`, the one place a run becomes a response — JSON (or text) when it is
over, or Server-Sent Events as it goes — with its metrics, a client that goes away (499, the job
cancelled) and a failure (a plain HTTP error before the first event, an SSE `error` event after).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from fastapi import Request, UploadFile
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel

from app.api.errors import UploadTooLargeError, to_api_error
from app.api.metrics import Metrics, Stopwatch
from app.api.schemas import ErrorEvent, ErrorObject
from app.service.errors import Rejected
from app.service.job_run import ENDED, JobRun
from app.service.transcription.jobs import TranscriptionResult

log = logging.getLogger(__name__)

T = TypeVar("T")
E = TypeVar("E")
R = TypeVar("R")
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class Disconnected(Exception):
    """The client went away before its answer was ready."""


def outcome(error: Exception) -> str:
    """Metrics label of a failed job: "rejected" (the client's fault, 4xx) or "error" (5xx)."""
    return "rejected" if to_api_error(error).status_code < 500 else "error"


async def read_upload(file: UploadFile, limit_bytes: int) -> bytes:
    """The uploaded bytes, refusing more than `limit_bytes` (the body limit has overhead)."""
    if file.size is not None and file.size > limit_bytes:
        raise UploadTooLargeError(limit_bytes)
    data = await file.read(limit_bytes + 1)
    if len(data) > limit_bytes:
        raise UploadTooLargeError(limit_bytes)
    if not data:
        raise Rejected("empty_file", "The uploaded file is empty", param="file")
    return data


async def until_disconnect(request: Request, awaitable: Awaitable[T]) -> T:
    """Await `awaitable`; if the client disconnects first, cancel it and raise `Disconnected`.

    Cancelling a `JobRun`'s `result()` drops a waiting job or sets the running job's cancel event.
    """
    task = asyncio.ensure_future(awaitable)
    watcher = asyncio.ensure_future(wait_for_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        watcher.cancel()
        raise
    if task.done():
        watcher.cancel()
        return task.result()
    task.cancel()
    with contextlib.suppress(BaseException):
        await task
    raise Disconnected


async def wait_for_disconnect(request: Request) -> None:
    """Return when the client closes the connection (the body has been read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def sse(event: BaseModel, *, compact: bool = False) -> bytes:
    """One SSE message; `compact` leaves out fields that are None (optional extensions)."""
    return f"data: {event.model_dump_json(exclude_none=compact)}\n\n".encode()


def failure_event(error: Exception, model: str, task: str, metrics: Metrics) -> bytes:
    """A streamed job failed after the response started: its failure counted (and logged when
    it is the server's fault) and the SSE `error` event that ends the stream."""
    api = to_api_error(error)
    if api.status_code >= 500:
        log.error("stream on %s failed", model, exc_info=error)
    metrics.observe_failure(model, task, outcome(error))
    return sse(ErrorEvent(error=ErrorObject(**api.body()["error"])))


@dataclass(frozen=True)
class JobReply(Generic[R]):
    """How one request's run is answered: `request` (to notice a disconnect), the metrics of
    `model` and `task`, `clock` started when the request came in, and `transcription` (the
    run's result -> its transcription, for the metrics)."""

    request: Request
    metrics: Metrics
    model: str
    task: str
    clock: Stopwatch
    transcription: Callable[[R], TranscriptionResult]

    async def whole(self, run: JobRun[object, R], respond: Callable[[R], Response]) -> Response:
        """`respond(result)` once the run is over; 499 if the client went away first."""
        try:
            result = await until_disconnect(self.request, run.result())
        except Disconnected:
            self._cancelled("client disconnected")
            return Response(status_code=499)
        except Exception as e:
            self.metrics.observe_failure(self.model, self.task, outcome(e))
            raise
        self._observe(run, result)
        return respond(result)

    async def stream(
        self,
        run: JobRun[E, R],
        events: Callable[[E], Iterable[BaseModel]],
        done: Callable[[R], BaseModel],
    ) -> Response:
        """Server-Sent Events: `events(e)` for each event the run posts, then `done(result)`.

        The response starts at the run's first event (or its end), so a job that fails before
        it — a full queue, bad audio — is still a plain HTTP error. Closing the connection
        cancels the job."""
        try:
            first = await until_disconnect(self.request, run.next())
        except (Disconnected, asyncio.CancelledError) as e:
            run.cancel()
            self._cancelled("stream client disconnected while queued")
            if isinstance(e, asyncio.CancelledError):
                raise
            return Response(status_code=499)
        if first is ENDED and (error := run.error()) is not None:
            self.metrics.observe_failure(self.model, self.task, outcome(error))
            raise error

        async def body() -> AsyncIterator[bytes]:
            self.metrics.active_streams.inc()
            sent = False
            event = first
            try:
                while event is not ENDED:
                    for item in events(event):  # type: ignore[arg-type]
                        if not sent:
                            self.metrics.first_delta_seconds.labels(self.model).observe(
                                self.clock()
                            )
                            sent = True
                        yield sse(item, compact=True)
                    event = await run.next()
                try:
                    result = await run.result()
                except Exception as e:
                    yield failure_event(e, self.model, self.task, self.metrics)
                    return
                self._observe(run, result)
                yield sse(done(result))
            finally:
                self.metrics.active_streams.dec()
                if not run.done:  # the client went away mid-stream
                    run.cancel()
                    self._cancelled("stream client disconnected")

        return StreamingResponse(body(), media_type="text/event-stream", headers=SSE_HEADERS)

    def _observe(self, run: JobRun, result: R) -> None:
        total = self.clock()
        self.metrics.observe_result(self.model, self.transcription(result), run.queue_wait_s, total)

    def _cancelled(self, why: str) -> None:
        log.info("%s; %s job on %s cancelled", why, self.task, self.model)
        self.metrics.observe_failure(self.model, self.task, "cancelled")
