"""Security on the live server with STT_API_KEY set (the `strict_server`).

- Every route the app has — found by walking `app.routes`, so a new endpoint is checked without
  editing this file — answers 401 (HTTP) or 1008 (WebSocket) to a missing, wrong or malformed
  key; only /health and the static page (/, /static/*: no secrets in it) are public. That
  includes /metrics, /docs and /openapi.json.
- Model names and static file names from a request never become paths.
- CORS is off unless STT_CORS_ORIGINS is set: no Access-Control-Allow-Origin for anyone.

test_strict_server.py covers the key on the five API routes and the upload/audio limits;
test_stream_ws.py the accepted ways to send the key on the WebSocket.
"""

from __future__ import annotations

import asyncio
import json
import re
from urllib.parse import quote

import httpx
import pytest
from fastapi.routing import APIWebSocketRoute
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from app.api import auth
from app.config import Settings
from app.main import create_app
from tests.api.conftest import JFK_WAV, STRICT_KEY, LiveServer, assert_openai_error
from tests.api.test_stream_ws import ws_url
from tests.conftest import MODELS_DIR

pytestmark = pytest.mark.timeout(120)

PUBLIC_PATHS = {"/health", "/", "/static/{name}"}
PATH_VALUES = {"model": "tiny.en", "name": "app.js", "voice_id": "voice_0"}  # {placeholders}
# DELETE /v1/models/{model} unloads: a built model that is not loaded answers 200, changes nothing
METHOD_PATH_VALUES = {"DELETE": {**PATH_VALUES, "model": "base"}}
BAD_KEYS = {
    "missing": {},
    "wrong": {"Authorization": "Bearer not-the-key"},
    "not bearer": {"Authorization": f"Basic {STRICT_KEY}"},
    "bare key": {"Authorization": STRICT_KEY},
    "key prefix": {"Authorization": f"Bearer {STRICT_KEY[:-1]}"},
    "key + more": {"Authorization": f"Bearer {STRICT_KEY}x"},
}


def flat_routes(routes: list) -> list:
    """Routes with `.path` (FastAPI >= 0.16x keeps included routers as lazy `_IncludedRouter`
    entries; their `effective_route_contexts()` are the routes with the prefix applied)."""
    flat = []
    for route in routes:
        if hasattr(route, "effective_route_contexts"):
            flat += [ctx for ctx in route.effective_route_contexts()]
        else:
            flat.append(route)
    return flat


def fill(template: str, method: str) -> str:
    """A route path with its `{placeholders}` (`{name:converter}` too) filled in for `method`."""
    values = METHOD_PATH_VALUES.get(method, PATH_VALUES)
    return re.sub(r"\{(\w+)(?::\w+)?\}", lambda m: values[m.group(1)], template)


def app_routes() -> tuple[list[tuple[str, str]], list[str]]:
    """([(method, path)] of the HTTP routes, [path] of the WebSocket routes) of a fresh app."""
    app = create_app(Settings(models=["tiny.en"], models_dir=MODELS_DIR))
    http, ws = [], []
    for route in flat_routes(app.routes):
        template = route.path or getattr(route, "starlette_route", route).path  # WS: in there
        if isinstance(getattr(route, "original_route", route), APIWebSocketRoute):
            ws.append(fill(template, "GET"))
        elif template not in PUBLIC_PATHS:
            methods = getattr(route, "methods", None) or {"GET"}
            http += [(m, fill(template, m)) for m in sorted(methods - {"HEAD"})]
    return http, ws


HTTP_ROUTES, WS_ROUTES = app_routes()


def test_the_route_walk_finds_the_endpoints() -> None:
    found = {path for _, path in HTTP_ROUTES}
    assert {"/metrics", "/docs", "/openapi.json", "/v1/models", "/v1/audio/transcriptions"} <= (
        found
    )
    assert WS_ROUTES == ["/v1/audio/stream", "/v1/realtime"]


@pytest.mark.parametrize(("method", "path"), HTTP_ROUTES)
@pytest.mark.parametrize("bad", list(BAD_KEYS))
def test_every_http_route_needs_the_key(
    strict_server: LiveServer, method: str, path: str, bad: str
) -> None:
    files = {"file": ("a.wav", JFK_WAV.read_bytes())} if method == "POST" else None
    r = httpx.request(
        method, strict_server.url(path), headers=BAD_KEYS[bad], files=files, timeout=30
    )
    error = assert_openai_error(r, 401)
    assert error["code"] == "invalid_api_key" and r.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize(("method", "path"), HTTP_ROUTES)
def test_every_http_route_opens_with_the_key(
    strict_server: LiveServer, method: str, path: str
) -> None:
    """The same routes with the key are not 401 (a POST without its form is a 400, a voice id
    that names none a 404)."""
    r = httpx.request(method, strict_server.url(path), headers=strict_server.auth, timeout=30)
    assert r.status_code in (200, 400, 404), (r.status_code, r.text[:300])
    if r.status_code == 404:
        assert r.json()["error"]["code"] == "voice_not_found", r.text


@pytest.mark.parametrize("path", ["/health", "/", "/static/app.js", "/static/worklet.js"])
def test_public_paths_hold_no_secret(strict_server: LiveServer, path: str) -> None:
    r = httpx.get(strict_server.url(path), timeout=10)
    assert r.status_code == 200
    assert STRICT_KEY not in r.text


async def ws_outcome(url: str, **kwargs: object) -> tuple[list[dict], int | None]:
    """(events, close code) of a WebSocket that, once its session is created, closes it."""
    events: list[dict] = []
    async with connect(url, **kwargs) as ws:
        try:
            async for message in ws:
                events.append(json.loads(message))
                if events[-1]["type"] == "session.created":
                    await ws.send(json.dumps({"type": "session.close"}))
        except ConnectionClosed:
            pass
        return events, ws.close_code


@pytest.mark.parametrize("path", WS_ROUTES)
@pytest.mark.parametrize(
    "how",
    ["missing", "wrong query", "wrong header", "wrong subprotocol", "key as plain subprotocol"],
)
def test_websocket_needs_the_key(strict_server: LiveServer, how: str, path: str) -> None:
    url = strict_server.base_url.replace("http://", "ws://") + path
    kwargs: dict[str, object] = {
        "missing": {},
        "wrong query": {"uri": url + "?api_key=nope"},
        "wrong header": {"additional_headers": {"Authorization": "Bearer nope"}},
        "wrong subprotocol": {"subprotocols": [f"{auth.WS_KEY_SUBPROTOCOL_PREFIX}nope"]},
        "key as plain subprotocol": {"subprotocols": [STRICT_KEY]},
    }[how]
    events, code = asyncio.run(ws_outcome(str(kwargs.pop("uri", url)), **kwargs))
    assert code == 1008
    assert [e["type"] for e in events] == ["error"]
    assert events[0]["error"]["code"] == "invalid_api_key"


def test_websocket_with_the_key_in_the_query(strict_server: LiveServer) -> None:
    url = ws_url(strict_server, f"?api_key={quote(STRICT_KEY)}")
    events, code = asyncio.run(ws_outcome(url))
    assert code == 1000
    assert [e["type"] for e in events] == ["session.created", "transcript.text.done"]


def test_key_compare_is_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = auth.secrets.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(auth.secrets, "compare_digest", spy)
    key = Settings(models=["tiny.en"], api_key="sécret-ключ").api_key
    assert auth.key_matches(key, "sécret-ключ")
    assert not auth.key_matches(key, "secret")
    assert not auth.key_matches(key, None)
    assert len(calls) == 2  # every presented key went through compare_digest, as bytes


# ---- no path from the request --------------------------------------------------------------
HOSTILE_MODEL_NAMES = [
    "../tiny.en",
    "/etc/passwd",
    "tiny.en/../tiny.en",
    "./tiny.en",
    "tiny.en/",
    "..",
    "tiny.en\x00",
    "%2e%2e%2ftiny.en",
    "C:\\models\\tiny.en",
]


@pytest.mark.parametrize("name", HOSTILE_MODEL_NAMES)
def test_model_names_are_looked_up_not_opened(strict_server: LiveServer, name: str) -> None:
    r = httpx.post(
        strict_server.url("/v1/audio/transcriptions"),
        headers=strict_server.auth,
        data={"model": name},
        files={"file": ("a.wav", JFK_WAV.read_bytes())},
        timeout=30,
    )
    error = assert_openai_error(r, 404, param="model")
    assert error["code"] == "model_not_found"
    if name.endswith("/"):
        return  # GET /v1/models/tiny.en/ is redirected to /v1/models/tiny.en: a lookup too
    r = httpx.get(
        strict_server.url("/v1/models/" + quote(name, safe="")),
        headers=strict_server.auth,
        timeout=10,
    )
    assert_openai_error(r, 404)


def test_stream_model_name_is_looked_up_not_opened(strict_server: LiveServer) -> None:
    async def go() -> list[dict]:
        url = ws_url(strict_server, f"?api_key={STRICT_KEY}")
        async with connect(url) as ws:
            for name in HOSTILE_MODEL_NAMES:
                update = {"type": "session.update", "session": {"model": name}}
                await ws.send(json.dumps(update))
            await ws.send(json.dumps({"type": "session.close"}))
            return [json.loads(m) async for m in ws]

    events = asyncio.run(go())
    codes = [e["error"]["code"] for e in events if e["type"] == "error"]
    assert codes == ["model_not_found"] * len(HOSTILE_MODEL_NAMES)


@pytest.mark.parametrize(
    "path", ["/static/..%2F..%2Fconfig.py", "/static/%2e%2e%2fmain.py", "/static/index.html%00"]
)
def test_static_names_are_a_fixed_list(strict_server: LiveServer, path: str) -> None:
    r = httpx.get(strict_server.url(path), timeout=10)
    assert r.status_code == 404
    assert "import" not in r.text


# ---- CORS ---------------------------------------------------------------------------------------
def test_cors_is_off_by_default(strict_server: LiveServer) -> None:
    origin = {"Origin": "https://evil.example"}
    r = httpx.get(strict_server.url("/v1/models"), headers={**strict_server.auth, **origin})
    assert r.status_code == 200
    assert not any(h.startswith("access-control-") for h in r.headers)
    preflight = httpx.options(
        strict_server.url("/v1/audio/transcriptions"),
        headers={
            **origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization",
        },
    )
    assert "access-control-allow-origin" not in preflight.headers
    health = httpx.get(strict_server.url("/health"), headers=origin)
    assert "access-control-allow-origin" not in health.headers
