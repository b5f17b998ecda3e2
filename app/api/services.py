"""What the routes and the live protocols use of the app: one typed `Services`, built by
`app.main.create_app`, handed to routes by the dependencies of `app.api.deps`."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Literal

from app.api.metrics import Metrics
from app.config import Settings
from app.service.diarize.job import LazyDiarizer
from app.service.live import LiveHost
from app.service.model_manager import ModelManager
from app.service.pool import WorkerPool


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


@dataclass(frozen=True)
class Services:
    """The app's long-lived objects."""

    settings: Settings
    models: ModelManager
    pool: WorkerPool
    metrics: Metrics
    readiness: Readiness
    live: LiveHost  # the live sessions: admission, their runners, the shutdown's drain
    diarizer: LazyDiarizer  # the speaker models, loaded by the first diarized request
