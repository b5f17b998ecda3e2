"""Optional API key: `Authorization: Bearer <STT_API_KEY>` on every endpoint but /health.

`require_api_key` is the HTTP dependency; `websocket_key` is the key a WebSocket client presented
(header, or the `openai-insecure-api-key.<key>` subprotocol that browsers can send, as OpenAI's
realtime API accepts), checked with `key_matches` at admission.
"""

from __future__ import annotations

import secrets

from fastapi import WebSocket
from pydantic import SecretStr
from starlette.requests import HTTPConnection

from app.api.deps import SettingsDep
from app.api.errors import APIError

WS_KEY_SUBPROTOCOL_PREFIX = "openai-insecure-api-key."


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, or None."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def key_matches(expected: SecretStr | None, presented: str | None) -> bool:
    """True when no key is configured, or `presented` equals it (constant-time compare)."""
    if expected is None:
        return True
    if presented is None:
        return False
    return secrets.compare_digest(
        presented.encode("utf-8"), expected.get_secret_value().encode("utf-8")
    )


def _unauthorized(presented: str | None) -> APIError:
    if presented is None:
        message = (
            "You didn't provide an API key. You need to provide your API key in an "
            "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
        )
    else:
        message = "Incorrect API key provided."
    return APIError(401, message, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})


async def require_api_key(conn: HTTPConnection, settings: SettingsDep) -> None:
    """Dependency: raise 401 unless the request carries the configured key (if any)."""
    if settings.api_key is None:
        return
    presented = bearer_token(conn.headers.get("authorization"))
    if not key_matches(settings.api_key, presented):
        raise _unauthorized(presented)


def websocket_key(websocket: WebSocket) -> str | None:
    """The key a WebSocket client presented: Bearer header first, then the subprotocol."""
    token = bearer_token(websocket.headers.get("authorization"))
    if token is not None:
        return token
    protocols = websocket.headers.get("sec-websocket-protocol", "")
    for proto in (p.strip() for p in protocols.split(",")):
        if proto.startswith(WS_KEY_SUBPROTOCOL_PREFIX):
            return proto[len(WS_KEY_SUBPROTOCOL_PREFIX) :]
    return None
