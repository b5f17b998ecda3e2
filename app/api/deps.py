"""FastAPI dependencies: the app's `Services` (built by `app.main`) and its parts, as
`Annotated` types for route parameters.

Tests replace one with `app.dependency_overrides[get_models] = ...` instead of patching globals.
Every dependency starts from an `HTTPConnection`, so it works for HTTP and WebSocket routes alike.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends
from starlette.requests import HTTPConnection

from app.api.errors import SERVER_ERROR, APIError
from app.api.metrics import Metrics
from app.api.services import Services
from app.config import Settings
from app.service.diarize.job import LazyDiarizer
from app.service.model_manager import ModelManager
from app.service.pool import WorkerPool


def get_services(conn: HTTPConnection) -> Services:
    services: Services = conn.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


def get_settings(services: ServicesDep) -> Settings:
    return services.settings


def get_models(services: ServicesDep) -> ModelManager:
    """The model manager, once the start-up models are loaded and warm; 503 before."""
    readiness = services.readiness
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
    return services.models


def get_pool(services: ServicesDep) -> WorkerPool:
    return services.pool


def get_metrics(services: ServicesDep) -> Metrics:
    return services.metrics


def get_diarizer(services: ServicesDep) -> LazyDiarizer:
    return services.diarizer


SettingsDep = Annotated[Settings, Depends(get_settings)]
ModelsDep = Annotated[ModelManager, Depends(get_models)]
PoolDep = Annotated[WorkerPool, Depends(get_pool)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
DiarizerDep = Annotated[LazyDiarizer, Depends(get_diarizer)]
