"""`GET /metrics`: the Prometheus exposition of the app's collector (`app.api.metrics`)."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from app.api.auth import require_api_key
from app.api.deps import MetricsDep

router = APIRouter(tags=["metrics"], dependencies=[Depends(require_api_key)])


@router.get("/metrics", include_in_schema=False)
async def metrics_endpoint(metrics: MetricsDep) -> Response:
    return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)
