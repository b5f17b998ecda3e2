"""What the routes and the live protocols use of the app: one typed `Services`, built by
`app.main.create_app`, handed to routes by the dependencies of `app.api.deps`."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Literal

from app.api.metrics import Metrics
from app.config import Settings
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


class LiveSessions:
    """The open live sessions (`with sessions:` around one) and the shutdown's signal to end
    them (`drain`); `none()` returns once none is open (the shutdown waits on it). Event loop
    only."""

    def __init__(self) -> None:
        self.count = 0
        self.drain = asyncio.Event()  # set at shutdown: sessions end as if the client closed them
        self._none = asyncio.Event()
        self._none.set()

    def __enter__(self) -> LiveSessions:
        self.count += 1
        self._none.clear()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.count -= 1
        if not self.count:
            self._none.set()

    async def none(self) -> None:
        await self._none.wait()


@dataclass(frozen=True)
class Services:
    """The app's long-lived objects."""

    settings: Settings
    models: ModelManager
    pool: WorkerPool
    metrics: Metrics
    readiness: Readiness = field(default_factory=Readiness)
    live: LiveSessions = field(default_factory=LiveSessions)
