"""FastAPI dependencies: the app's `Services` (built by `app.main`) and its parts, as
`Annotated` types for route parameters.

Tests replace one with `app.dependency_overrides[get_models] = ...` instead of patching globals.
Every dependency starts from an `HTTPConnection`, so it works for HTTP and WebSocket routes alike.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends
from starlette.requests import HTTPConnection

from app.api.metrics import Metrics
from app.api.services import Services
from app.config import Settings
from app.service.diarize.job import LazyDiarizer
from app.service.models.manager import ModelManager
from app.service.pool import WorkerPool
from app.service.voices.registry import VoiceRegistry


def get_services(conn: HTTPConnection) -> Services:
    services: Services = conn.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


def get_settings(services: ServicesDep) -> Settings:
    return services.settings


def get_models(services: ServicesDep) -> ModelManager:
    """The model manager, when the server's gate lets a request in (503 while loading, after a
    failed load, once stopping)."""
    services.gate.check("request")
    return services.models


def get_pool(services: ServicesDep) -> WorkerPool:
    return services.pool


def get_metrics(services: ServicesDep) -> Metrics:
    return services.metrics


def get_diarizer(services: ServicesDep) -> LazyDiarizer:
    return services.diarizer


def get_voices(services: ServicesDep) -> VoiceRegistry:
    return services.voices


SettingsDep = Annotated[Settings, Depends(get_settings)]
ModelsDep = Annotated[ModelManager, Depends(get_models)]
PoolDep = Annotated[WorkerPool, Depends(get_pool)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
DiarizerDep = Annotated[LazyDiarizer, Depends(get_diarizer)]
VoicesDep = Annotated[VoiceRegistry, Depends(get_voices)]
