"""FastAPI dependencies: the heavy objects live on `app.state`, built by `app.main`.

Tests replace them with `app.dependency_overrides[get_models] = ...` instead of patching globals.
Every dependency takes an `HTTPConnection`, so it works for HTTP and WebSocket routes alike.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from starlette.requests import HTTPConnection

from app.api.errors import SERVER_ERROR, APIError
from app.config import Settings
from app.service.model_manager import ModelManager
from app.service.pool import WorkerPool

if TYPE_CHECKING:
    from app.api.metrics import Metrics


@dataclass
class Readiness:
    """Model loading progress, shared between the loader thread and /health."""

    status: Literal["loading", "ready", "failed"] = "loading"
    error: str | None = None
    since: float = 0.0  # time.time() of the last change
    draining: bool = False  # shutting down: /health answers 503 while requests are still served
    _event: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def ready(self) -> bool:
        return self.status == "ready"

    def wait(self, timeout: float | None = None) -> bool:
        """Block until loading ended (ready or failed); True if it did within `timeout`."""
        return self._event.wait(timeout)

    def finish(self, error: str | None, now: float) -> None:
        self.status = "failed" if error else "ready"
        self.error = error
        self.since = now
        self._event.set()


def get_settings(conn: HTTPConnection) -> Settings:
    return conn.app.state.settings


def get_readiness(conn: HTTPConnection) -> Readiness:
    return conn.app.state.readiness


def get_models(conn: HTTPConnection) -> ModelManager:
    """The model manager, once the start-up models are loaded and warm; 503 before."""
    readiness: Readiness = conn.app.state.readiness
    if not readiness.ready:
        if readiness.status == "failed":
            raise APIError(
                503,
                f"Model loading failed: {readiness.error}",
                type_=SERVER_ERROR,
                code="model_load_failed",
            )
        raise APIError(
            503,
            "The models are still loading; retry shortly",
            type_=SERVER_ERROR,
            code="loading",
            headers={"Retry-After": "5"},
        )
    return conn.app.state.models


def get_pool(conn: HTTPConnection) -> WorkerPool:
    return conn.app.state.pool


def get_metrics(conn: HTTPConnection) -> Metrics:
    return conn.app.state.metrics
