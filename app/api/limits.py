"""Upload size limit, enforced while the body is read (nothing is buffered past the limit)."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.errors import UploadTooLargeError

# Room for the multipart boundaries and the small form fields next to the file.
MULTIPART_OVERHEAD_BYTES = 64 * 1024


class UploadLimitMiddleware:
    """Stops reading a request body once it passes `limit + overhead` bytes.

    A `Content-Length` above the limit is refused before any of the body is read; a chunked
    body is counted as it arrives. The error (`UploadTooLargeError`, 413) is raised from
    `receive`, inside the route, so the app's handlers give it OpenAI's error shape.
    The exact file-size check (without overhead) happens in the route after parsing.
    """

    def __init__(self, app: ASGIApp, limit_bytes: int, paths: tuple[str, ...] = ()) -> None:
        self.app = app
        self.limit_bytes = limit_bytes
        self.max_body = limit_bytes + MULTIPART_OVERHEAD_BYTES
        self.paths = paths  # path prefixes to guard; empty = every HTTP request

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (self.paths and not scope["path"].startswith(self.paths)):
            await self.app(scope, receive, send)
            return

        declared = _content_length(scope)
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            if declared is not None and declared > self.max_body:
                raise UploadTooLargeError(self.limit_bytes)
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body:
                    raise UploadTooLargeError(self.limit_bytes)
            return message

        await self.app(scope, limited_receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
