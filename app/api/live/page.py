"""The browser page at `/` (live transcription from the microphone, file upload) and its
static files."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse, Response

router = APIRouter(tags=["page"])

STATIC_DIR = Path(__file__).resolve().parents[2] / "static"
STATIC_FILES = {
    "app.js": "text/javascript",
    "worklet.js": "text/javascript",
    "style.css": "text/css",
}


@router.get("/", include_in_schema=False)
async def index() -> Response:
    return FileResponse(STATIC_DIR / "index.html", media_type="text/html")


@router.get("/static/{name}", include_in_schema=False)
async def static_file(name: str) -> Response:
    media_type = STATIC_FILES.get(name)  # a fixed list: no path from the request touches disk
    if media_type is None or not (STATIC_DIR / name).is_file():
        return Response(status_code=404)
    return FileResponse(STATIC_DIR / name, media_type=media_type)
