"""The HTTP side of a job on the worker pool, shared by the audio routes: reading the upload,
waiting for the job while watching for a client that goes away, the metrics outcome of a failure,
and Server-Sent Events (incl. the `error` event of a stream whose job failed)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable
from concurrent.futures import Future
from typing import TypeVar

from fastapi import Request, UploadFile
from pydantic import BaseModel

from app.api.errors import APIError, UploadTooLargeError, to_api_error
from app.api.metrics import Metrics
from app.api.schemas import ErrorEvent, ErrorObject

log = logging.getLogger(__name__)

T = TypeVar("T")
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class Disconnected(Exception):
    """The client went away before its answer was ready."""


async def job_result(future: Future[T], cancel: threading.Event) -> T:
    """The job's result; cancelling the wait drops a waiting job or stops a running one."""
    try:
        return await asyncio.wrap_future(future)
    except asyncio.CancelledError:
        cancel.set()
        future.cancel()
        raise


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
        raise APIError(400, "The uploaded file is empty", param="file", code="empty_file")
    return data


async def until_disconnect(request: Request, awaitable: Awaitable[T]) -> T:
    """Await `awaitable`; if the client disconnects first, cancel it and raise `Disconnected`.

    Cancelling `pool.run(...)` drops a waiting job or sets the running job's cancel event.
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
