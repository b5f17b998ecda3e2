"""`GET /health`: 503 while models load (or if loading failed) and once shutdown began
(draining), 200 with model and device info."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from app.api.deps import Readiness, get_pool, get_readiness, get_settings
from app.api.schemas import Health, HealthModel
from app.config import Settings
from app.service.pool import WorkerPool

router = APIRouter(tags=["health"])


@router.get("/health", response_model=Health, responses={503: {"model": Health}})
async def health(
    request: Request,
    readiness: Annotated[Readiness, Depends(get_readiness)],
    pool: Annotated[WorkerPool, Depends(get_pool)],
    settings: Annotated[Settings, Depends(get_settings)],
) -> JSONResponse:
    """Readiness and liveness in one (no API key needed): 200 once the start-up models are
    warm, 503 again once a shutdown signal came (a load balancer stops sending new work here).
    `models` are the models loaded now, each with the memory its load took."""
    models: list[HealthModel] = []
    if readiness.ready:
        models = [
            HealthModel(
                name=i.name,
                multilingual=i.multilingual,
                devices=i.devices,
                load_s=i.load_s,
                warmup_s=i.warmup_s,
                memory_bytes=i.memory_bytes,
            )
            for i in request.app.state.models.infos()
        ]
    stats = pool.stats()
    serving = readiness.ready and not readiness.draining
    body = Health(
        status="draining" if readiness.draining else readiness.status,
        error=readiness.error,
        default_model=settings.resolved_default_model,
        models=models,
        workers=stats.workers,
        max_queue=stats.max_queue,
        active=stats.active,
        queued=stats.queued,
    )
    return JSONResponse(body.model_dump(), status_code=200 if serving else 503)
