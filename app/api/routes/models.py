"""`/v1/models`: list, retrieve (OpenAI's shapes), load (POST) and unload (DELETE) models.

Ids may hold a `/` (Hub repository ids), hence the path converter. `POST` answers 200 when the
model is loaded already, else 202 while it is fetched/built/loaded (progress on `GET`); `DELETE`
answers 200 once unloaded, 202 while requests in flight finish (409 while it is still loading).
Always behind the API key.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path
from fastapi.responses import JSONResponse
from pydantic import AfterValidator

from app.api.auth import require_api_key
from app.api.deps import ModelsDep
from app.api.schemas import ERROR_RESPONSES, ModelList, ModelObject
from app.service.models.options import ModelStatus

router = APIRouter(prefix="/v1", tags=["models"], dependencies=[Depends(require_api_key)])


def _named(model: str) -> str:
    if not model.strip():  # the manager reads a request's missing model as the default one
        raise ValueError("a model id cannot be blank")
    return model


ModelId = Annotated[
    str,
    Path(description="A model id; may contain '/' (org/name)."),
    AfterValidator(_named),
]
_CHANGE_RESPONSES: dict[int | str, dict[str, object]] = {
    202: {"model": ModelObject, "description": "Started; its state and progress on GET"},
    403: {"description": "The model needs new weights and STT_MODEL_DOWNLOADS is off"},
    409: {"description": "The model is being unloaded or loaded"},
    **ERROR_RESPONSES,
}


@router.get("/models", responses=ERROR_RESPONSES)
async def list_models(models: ModelsDep) -> ModelList:
    """Loaded models and those that can be loaded (built folders, the catalog and aliases)."""
    return ModelList(data=[ModelObject.from_status(s) for s in models.statuses()])


@router.get("/models/{model:path}", responses=ERROR_RESPONSES)
async def retrieve_model(model: ModelId, models: ModelsDep) -> ModelObject:
    """One model and its state; 404 if it is neither built, known nor being loaded."""
    return ModelObject.from_status(models.status(model))


@router.post("/models/{model:path}", response_model=ModelObject, responses=_CHANGE_RESPONSES)
async def load_model(model: ModelId, models: ModelsDep) -> JSONResponse:
    """Fetch, build and load a model: 200 when loaded already, else 202."""
    return _answer(models.load(model), done="loaded")


@router.delete("/models/{model:path}", response_model=ModelObject, responses=_CHANGE_RESPONSES)
async def unload_model(model: ModelId, models: ModelsDep) -> JSONResponse:
    """Unload a model once its requests in flight finish: 200 when unloaded, else 202."""
    return _answer(models.unload(model), done="available")


def _answer(status: ModelStatus, *, done: str) -> JSONResponse:
    body = ModelObject.from_status(status)
    code = 200 if body.state in (done, "failed") else 202
    return JSONResponse(body.model_dump(), status_code=code)
