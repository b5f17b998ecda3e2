"""Optional API key: `Authorization: Bearer <STT_API_KEY>` on every endpoint but /health.

The one place the key is read (`presented_key`: header, and on WebSockets the
`openai-insecure-api-key.<key>` subprotocol that browsers can send, as OpenAI's realtime API
accepts, or `?api_key=`) and checked (`key_refusal`): `require_api_key` is the HTTP dependency,
the WebSocket admission asks `key_refusal` too.

Client secrets (`POST /v1/realtime/client_secrets`, OpenAI's short-lived keys for browsers):
"ek_" + the secret's expiry and session configuration + an HMAC-SHA256 of them under a key
derived from STT_API_KEY. Nothing is stored: every replica with the same key checks one, a
restart keeps them valid, changing the key revokes them all. One opens the Realtime endpoint
(`key_refusal(..., client_secrets=True)`) until it expires; a session it opened goes on after.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import time
from typing import Any

from pydantic import SecretStr
from starlette.requests import HTTPConnection

from app.api.deps import SettingsDep
from app.service.errors import Rejected

WS_KEY_SUBPROTOCOL_PREFIX = "openai-insecure-api-key."
CLIENT_SECRET_PREFIX = "ek_"


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


def key_refusal(
    expected: SecretStr | None, conn: HTTPConnection, *, client_secrets: bool = False
) -> Rejected | None:
    """The refusal of a client without the configured key (if one is), or, where
    `client_secrets` open the door, without an unexpired one; None: let it in."""
    presented = presented_key(conn)
    if client_secrets and presented is not None and presented.startswith(CLIENT_SECRET_PREFIX):
        try:
            secret_session(expected, presented, now=time.time())
        except Rejected as refusal:
            return refusal
        return None
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


# ---- client secrets ---------------------------------------------------------------------------


def _signing_key(expected: SecretStr | None) -> bytes:
    key = expected.get_secret_value() if expected is not None else ""
    return hashlib.sha256(b"stt-openvino client secret\0" + key.encode("utf-8")).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def client_secret(expected: SecretStr | None, session: dict[str, Any], expires_at: int) -> str:
    """A client secret for `session` (the Realtime session settings it opens with) until
    `expires_at` (Unix seconds)."""
    payload = _b64(json.dumps({"exp": expires_at, "session": session}).encode("utf-8"))
    signature = hmac.new(_signing_key(expected), payload.encode("ascii"), hashlib.sha256)
    return f"{CLIENT_SECRET_PREFIX}{payload}.{_b64(signature.digest())}"


def secret_session(expected: SecretStr | None, secret: str, *, now: float) -> dict[str, Any]:
    """The session settings of a client secret this server's key signed; `Rejected`
    (unauthorized) when it is not one, or it expired."""
    payload, _, signature = secret.removeprefix(CLIENT_SECRET_PREFIX).partition(".")
    wanted = hmac.new(_signing_key(expected), payload.encode("ascii", "replace"), hashlib.sha256)
    try:
        valid = hmac.compare_digest(_unb64(signature), wanted.digest())
        claims = json.loads(_unb64(payload)) if valid else None
    except (binascii.Error, ValueError):
        claims = None
    if not isinstance(claims, dict):  # signed by us: it has both fields
        message = "Incorrect client secret provided."
        raise Rejected("invalid_client_secret", message, kind="unauthorized")
    if now >= claims["exp"]:
        message = "The client secret has expired; create another."
        raise Rejected("client_secret_expired", message, kind="unauthorized")
    return claims["session"]
