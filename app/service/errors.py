"""The one error the service raises to refuse a request: "reject with this code".

Every adapter (REST, the Realtime protocol, the own WebSocket, Wyoming) maps `kind` to its wire
once (an HTTP status, a WebSocket close code, a Wyoming error event) and passes `code`, `message`
and `param` through unchanged; no adapter inspects the message.
"""

from __future__ import annotations

from typing import Literal

RejectionKind = Literal[
    "invalid_request", "unauthorized", "not_found", "forbidden", "conflict", "busy",
    "unavailable", "limit", "storage", "failed",
]  # fmt: skip


class Rejected(Exception):
    """A request the service refuses.

    code: machine-readable reason ("invalid_value", "model_not_found", "queue_full",
    "session_too_long" ...); message: for a person; param: the request field at fault, if one is;
    kind: what sort of refusal — invalid_request (the client sent a value the service cannot
    use), unauthorized (it did not present the API key), not_found (it named something that does
    not exist), forbidden (this server's settings do not allow it), conflict (it clashes with
    what is under way, such as an unload), busy (try again soon: `retry_after_s`), unavailable
    (the service or a model cannot serve now; may carry `retry_after_s`), limit (a size or
    duration bound was passed), storage (the server's disk is full), failed (the server's own
    state is broken: a person has to mend it).
    """

    def __init__(
        self,
        code: str,
        message: str,
        *,
        param: str | None = None,
        kind: RejectionKind = "invalid_request",
        retry_after_s: int | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.kind = kind
        self.retry_after_s = retry_after_s
