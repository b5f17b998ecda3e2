"""`POST /v1/realtime/client_secrets`: a short-lived key that opens Realtime transcription
sessions, so a browser app never holds the server's key (OpenAI's endpoint, transcription
sessions only).

The body: `expires_after` (`anchor` "created_at", `seconds` 10..7200, default 600) and `session`
(a GA transcription session, as `session.update` takes it). The session is checked as a
`session.update` would be, but strictly: a setting this server would ignore is refused here (no
event could tell the client later). The answer: `value` (the secret), `expires_at` and the
session object. A session opened with the secret starts from those settings; `session.update`
may change them. The secret itself: `app.api.auth.client_secret`.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, Depends
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from app.api.auth import client_secret, require_api_key
from app.api.deps import ModelsDep, SettingsDep
from app.api.live.realtime_config import MODEL_PARAM, RealtimeConfig, apply_ga, session_ga
from app.api.live.realtime_events import new_session_id
from app.api.schemas import ERROR_RESPONSES
from app.service.errors import Rejected

router = APIRouter(tags=["streaming"], dependencies=[Depends(require_api_key)])


class ExpiresAfter(BaseModel):
    model_config = ConfigDict(extra="forbid")

    anchor: Literal["created_at"] = "created_at"
    seconds: int = Field(default=600, ge=10, le=7200)


class ClientSecretRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    expires_after: ExpiresAfter = Field(default_factory=ExpiresAfter)
    session: dict[str, Any] = Field(default_factory=lambda: {"type": "transcription"})


class ClientSecretResponse(BaseModel):
    value: str
    expires_at: int  # Unix seconds
    session: dict[str, Any]


def secret_config(session: dict[str, Any], base: RealtimeConfig) -> RealtimeConfig:
    """The settings a secret's `session` gives a session that starts from `base`; `Rejected`
    (naming the setting) for anything `session.update` would refuse or ignore."""
    config, problems = apply_ga(base, session)
    if problems:
        raise Rejected("invalid_value", problems[0].message, param=problems[0].param)
    return config


@router.post(
    "/v1/realtime/client_secrets",
    response_model=ClientSecretResponse,
    responses=ERROR_RESPONSES,
)
async def create_client_secret(
    models: ModelsDep,
    settings: SettingsDep,
    request: Annotated[ClientSecretRequest | None, Body()] = None,
) -> JSONResponse:
    """A client secret for Realtime transcription sessions with the given settings."""
    request = request or ClientSecretRequest()
    # a session without its type is refused by the same check as one of another type
    config = secret_config({"type": None, **request.session}, RealtimeConfig())
    try:  # an unknown model is refused now, not at the first session
        models.status(config.model or "")
    except Rejected as e:
        raise Rejected(e.code, e.message, param=MODEL_PARAM, kind=e.kind) from e
    expires_at = int(time.time()) + request.expires_after.seconds
    secret = client_secret(settings.api_key, request.session, expires_at)
    session = session_ga(config, new_session_id())
    body = ClientSecretResponse(value=secret, expires_at=expires_at, session=session)
    return JSONResponse(body.model_dump())
