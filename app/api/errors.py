"""HTTP errors at the edge: every error leaves as OpenAI's `{"error": {message, type, ...}}`.

The service refuses a request with one error, `Rejected`; its `kind` is mapped to a status here
and nowhere else (`REJECTION_STATUS`): a bad parameter 400, no or a wrong API key 401
(`WWW-Authenticate: Bearer`), fetching off 403, an unknown model
404, a model being unloaded 409, a limit 413, a full queue 429, a model loading, no room or
shutting down 503, a full disk 507, the server's own broken state (a damaged file) 500;
`retry_after_s` becomes `Retry-After`. The engine's audio errors: undecodable
415, too long 413. Validation 400, a load that failed 500 with its reason, anything unexpected
500.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.service.errors import Rejected, RejectionKind
from app.service.models.loaded import AudioDecodeError, AudioTooLongError, TranscriptionCancelled
from app.service.models.opening import ModelLoadError

log = logging.getLogger(__name__)

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"
REJECTION_STATUS: dict[RejectionKind, int] = {
    "invalid_request": 400,
    "unauthorized": 401,
    "forbidden": 403,
    "not_found": 404,
    "conflict": 409,
    "limit": 413,
    "busy": 429,
    "unavailable": 503,
    "storage": 507,
    "failed": 500,
}


def error_type(refusal: Rejected) -> str:
    """OpenAI's error `type` of a refusal, the same on every wire (REST, SSE, both WebSockets):
    the server cannot serve now or failed (5xx), slow down (429), or the client's request."""
    status = REJECTION_STATUS[refusal.kind]
    if status == 429:
        return "rate_limit_error"
    return SERVER_ERROR if status >= 500 else INVALID_REQUEST


def error_body(
    message: str, type_: str = INVALID_REQUEST, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


class APIError(Exception):
    """An error with its HTTP status and OpenAI fields, raised by routes and dependencies."""

    def __init__(
        self,
        status_code: int,
        message: str,
        *,
        type_: str = INVALID_REQUEST,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.type = type_
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.type, self.param, self.code)

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status_code, headers=self.headers)


class UploadTooLargeError(StarletteHTTPException):
    """The request body passed the upload limit while it was being read.

    An `HTTPException` so that FastAPI's form parsing lets it through unchanged.
    """

    def __init__(self, limit_bytes: int) -> None:
        super().__init__(413, f"The upload exceeds the limit of {limit_bytes / 2**20:g} MB")
        self.limit_bytes = limit_bytes


def to_api_error(exc: Exception) -> APIError:
    """Map a domain or framework error to an `APIError` (also used for SSE `error` events)."""
    match exc:
        case APIError():
            return exc
        case Rejected():
            return _from_rejected(exc)
        case AudioTooLongError():
            return APIError(413, f"Audio too long: {exc}", param="file", code="audio_too_long")
        case AudioDecodeError():
            return APIError(
                415, f"Invalid file format: {exc}", param="file", code="unsupported_audio"
            )
        case ModelLoadError():
            return APIError(500, str(exc), type_=SERVER_ERROR, code="model_load_failed")
        case TranscriptionCancelled():
            return APIError(499, "The request was cancelled", code="cancelled")
        case UploadTooLargeError():
            return APIError(413, str(exc.detail), param="file", code="upload_too_large")
        case StarletteHTTPException():
            return _from_http_exception(exc)
        case _:
            return APIError(
                500, "The server had an error while processing your request", type_=SERVER_ERROR
            )


def _from_rejected(exc: Rejected) -> APIError:
    headers = {} if exc.retry_after_s is None else {"Retry-After": str(exc.retry_after_s)}
    if exc.kind == "unauthorized":
        headers["WWW-Authenticate"] = "Bearer"
    return APIError(
        REJECTION_STATUS[exc.kind],
        exc.message,
        type_=error_type(exc),
        param=exc.param,
        code=exc.code,
        headers=headers or None,
    )


def _from_http_exception(exc: StarletteHTTPException) -> APIError:
    code = {404: "not_found", 405: "method_not_allowed", 413: "upload_too_large"}.get(
        exc.status_code
    )
    type_ = SERVER_ERROR if exc.status_code >= 500 else INVALID_REQUEST
    headers = dict(exc.headers) if exc.headers else None
    return APIError(exc.status_code, str(exc.detail), type_=type_, code=code, headers=headers)


def _validation_error(exc: RequestValidationError) -> APIError:
    """FastAPI's 422 becomes OpenAI's 400 naming the first offending parameter."""
    errors = exc.errors()
    if not errors:
        return APIError(400, "Invalid request")
    first = errors[0]
    places = ("body", "query", "header", "form", "path")
    loc = [str(p) for p in first.get("loc", ()) if p not in places]
    param = loc[0] if loc else None
    if first.get("type") == "missing":
        message = f"Missing required parameter: '{param}'"
    else:
        message = f"Invalid value for '{param}': {first.get('msg', 'invalid')}"
        if len(errors) > 1:
            message += f" (and {len(errors) - 1} more error(s))"
    return APIError(400, message, param=param, code="invalid_value")


async def _handle_api_error(_request: Request, exc: Exception) -> JSONResponse:
    return to_api_error(exc).response()


async def _handle_validation(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return _validation_error(exc).response()


async def _handle_http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    error = to_api_error(exc)
    if exc.status_code == 404 and exc.detail == "Not Found":
        error.message = f"Unknown request URL: {request.method} {request.url.path}"
    return error.response()


async def _handle_unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return to_api_error(exc).response()


def install_error_handlers(app: FastAPI) -> None:
    """Register the OpenAI-shaped handlers for every error a request can end in."""
    app.add_exception_handler(RequestValidationError, _handle_validation)
    app.add_exception_handler(StarletteHTTPException, _handle_http)
    for cls in (
        APIError,
        Rejected,
        AudioDecodeError,
        ModelLoadError,
        TranscriptionCancelled,
    ):
        app.add_exception_handler(cls, _handle_api_error)
    app.add_exception_handler(Exception, _handle_unexpected)
