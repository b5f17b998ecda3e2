"""`GET /health`: 503 while models load (or if loading failed) and once shutdown began
(draining), 200 with model and device info."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from app.api.deps import ServicesDep
from app.api.schemas import Health, HealthModel

router = APIRouter(tags=["health"])


@router.get("/health", response_model=Health, responses={503: {"model": Health}})
async def health(services: ServicesDep) -> JSONResponse:
    """Readiness and liveness in one (no API key needed): 200 once the start-up models are
    warm, 503 again once a shutdown signal came (a load balancer stops sending new work here).
    `models` are the models loaded now, each with the memory its load took."""
    gate = services.gate
    models: list[HealthModel] = []
    if gate.state in ("ready", "draining"):
        models = [
            HealthModel(
                name=i.name,
                multilingual=i.multilingual,
                devices=i.devices,
                arithmetic=i.arithmetic,
                load_s=i.load_s,
                warmup_s=i.warmup_s,
                memory_bytes=i.memory_bytes,
            )
            for i in services.models.infos()
        ]
    stats = services.pool.stats()
    body = Health(
        status=gate.state,
        error=gate.error,
        default_model=services.settings.resolved_default_model,
        models=models,
        workers=stats.workers,
        max_queue=stats.max_queue,
        active=stats.active,
        queued=stats.queued,
    )
    return JSONResponse(body.model_dump(), status_code=200 if gate.serving else 503)
