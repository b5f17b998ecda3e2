"""`GET /openapi.json` and `GET /docs` (Swagger UI), behind the API key like every endpoint but
/health: the schema lists what the server can do, which is not for anyone who can reach the port.

Without `STT_API_KEY` both are open, as FastAPI serves them by default. With a key, send
`Authorization: Bearer <key>` (curl, schemathesis, an SDK generator); a browser that opens /docs
cannot add the header, so the interactive page is for keyless (development) servers.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse

from app.api.auth import require_api_key

OPENAPI_URL = "/openapi.json"

router = APIRouter(include_in_schema=False, dependencies=[Depends(require_api_key)])


@router.get(OPENAPI_URL)
async def openapi_schema(request: Request) -> JSONResponse:
    return JSONResponse(request.app.openapi())


@router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    return get_swagger_ui_html(openapi_url=OPENAPI_URL, title=f"{request.app.title} - API")
