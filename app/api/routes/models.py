"""`GET /v1/models` and `GET /v1/models/{model}`: the loaded models, in OpenAI's list shape."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends

from app.api.auth import require_api_key
from app.api.deps import get_registry
from app.api.schemas import ERROR_RESPONSES, ModelList, ModelObject
from app.service.registry import ModelRegistry

router = APIRouter(prefix="/v1", tags=["models"], dependencies=[Depends(require_api_key)])


@router.get("/models", responses=ERROR_RESPONSES)
async def list_models(registry: Annotated[ModelRegistry, Depends(get_registry)]) -> ModelList:
    """The models this server has loaded and can transcribe with."""
    return ModelList(data=[ModelObject.from_info(info) for info in registry.infos()])


@router.get("/models/{model}", responses=ERROR_RESPONSES)
async def retrieve_model(
    model: str, registry: Annotated[ModelRegistry, Depends(get_registry)]
) -> ModelObject:
    """One loaded model; 404 if it is not loaded."""
    return ModelObject.from_info(registry.get(model).info)
