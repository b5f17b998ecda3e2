"""What the routes and the live protocols use of the app: one typed `Services`, built by
`app.main.create_app`, handed to routes by the dependencies of `app.api.deps`."""

from __future__ import annotations

from dataclasses import dataclass

from app.api.metrics import Metrics
from app.config import Settings
from app.service.diarize.job import LazyDiarizer
from app.service.gate import ServerGate
from app.service.live import LiveHost
from app.service.models.manager import ModelManager
from app.service.pool import WorkerPool
from app.service.voices.registry import VoiceRegistry


@dataclass(frozen=True)
class Services:
    """The app's long-lived objects."""

    settings: Settings
    models: ModelManager
    pool: WorkerPool
    metrics: Metrics
    gate: ServerGate  # whether the server takes new work: loading, ready, draining ...
    live: LiveHost  # the live sessions: admission, their runners, the shutdown's drain
    diarizer: LazyDiarizer  # the speaker models, loaded by the first diarized request
    voices: VoiceRegistry  # enrolled voices (used only with settings.voices)
