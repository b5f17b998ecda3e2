"""Optional API key: `Authorization: Bearer <STT_API_KEY>` on every endpoint but /health.

The one place the key is read (`presented_key`: header, and on WebSockets the
`openai-insecure-api-key.<key>` subprotocol that browsers can send, as OpenAI's realtime API
accepts, or `?api_key=`) and checked (`key_refusal`): `require_api_key` is the HTTP dependency,
the WebSocket admission asks `key_refusal` too.
"""

from __future__ import annotations

import secrets

from pydantic import SecretStr
from starlette.requests import HTTPConnection

from app.api.deps import SettingsDep
from app.service.errors import Rejected

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


def presented_key(conn: HTTPConnection) -> str | None:
    """The key a client presented: the Bearer header; on a WebSocket also the
    `openai-insecure-api-key.<key>` subprotocol (browsers cannot set headers) or `?api_key=`."""
    token = bearer_token(conn.headers.get("authorization"))
    if token is not None or conn.scope["type"] != "websocket":
        return token
    protocols = conn.headers.get("sec-websocket-protocol", "")
    for proto in (p.strip() for p in protocols.split(",")):
        if proto.startswith(WS_KEY_SUBPROTOCOL_PREFIX):
            return proto[len(WS_KEY_SUBPROTOCOL_PREFIX) :]
    return conn.query_params.get("api_key")


def key_refusal(expected: SecretStr | None, conn: HTTPConnection) -> Rejected | None:
    """The refusal of a client without the configured key (if one is); None: let it in."""
    presented = presented_key(conn)
    if key_matches(expected, presented):
        return None
    if presented is None:
        message = (
            "You didn't provide an API key. You need to provide your API key in an "
            "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
        )
    else:
        message = "Incorrect API key provided."
    return Rejected("invalid_api_key", message, kind="unauthorized")


async def require_api_key(conn: HTTPConnection, settings: SettingsDep) -> None:
    """Dependency: 401 unless the request carries the configured key (if any)."""
    refusal = key_refusal(settings.api_key, conn)
    if refusal is not None:
        raise refusal
