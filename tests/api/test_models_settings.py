"""Model management as the operator's settings shape it, against a real server with the
defaults (fetching new weights off, autoload off) and STT_MODEL_TTL_S=2: idle models unload after
the TTL (not the default model), a request naming an unloaded model is refused, unbuilt models
need downloads allowed, unknown ids, Hub ids in the path, the API key on every management route.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from fastapi.testclient import TestClient

from app.config import Settings
from app.main import create_app
from tests.api.conftest import (
    JFK_TEXT,
    JFK_WAV,
    LiveServer,
    assert_openai_error,
    normalise,
    start_server,
    stop_server,
)
from tests.api.test_security import ws_outcome
from tests.conftest import MODELS_DIR, model_dir

pytestmark = pytest.mark.timeout(300)

KEY = "settings-key-0123"
TTL_S = 2.0


@pytest.fixture(scope="module")
def ttl_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    model_dir("base")
    live = start_server(
        tmp_path_factory.mktemp("ttl"), "ttl", STT_MODELS_DIR=str(MODELS_DIR), STT_API_KEY=KEY,
        STT_MODEL_TTL_S=str(TTL_S),
    )  # fmt: skip
    yield live
    stop_server(live)


def transcribe(server: LiveServer, model: str) -> httpx.Response:
    return httpx.post(
        server.url("/v1/audio/transcriptions"), headers=server.auth, data={"model": model},
        files={"file": ("jfk.wav", JFK_WAV.read_bytes())}, timeout=120,
    )  # fmt: skip


def test_without_autoload_a_request_needs_the_model_loaded_first(ttl_server: LiveServer) -> None:
    error = assert_openai_error(transcribe(ttl_server, "base"), 404, param="model")
    assert error["code"] == "model_not_found"
    assert "not loaded" in error["message"] and "POST /v1/models/base" in error["message"]
    assert get_state(ttl_server, "base") == "available"  # the request loaded nothing


def test_an_idle_model_unloads_after_the_ttl_but_not_the_default(ttl_server: LiveServer) -> None:
    client = openai.OpenAI(base_url=ttl_server.url("/v1"), api_key=KEY, max_retries=0)
    assert not client.models.retrieve("base").loaded  # type: ignore[attr-defined]
    r = httpx.post(ttl_server.url("/v1/models/base"), headers=ttl_server.auth, timeout=10)
    assert r.status_code == 202 and r.json()["state"] == "loading"  # built: no build step
    deadline = time.monotonic() + 120
    while get_state(ttl_server, "base") != "loaded":
        assert time.monotonic() < deadline, ttl_server.log_tail()
        time.sleep(0.1)
    r = transcribe(ttl_server, "base")
    assert r.status_code == 200 and normalise(r.json()["text"]) == normalise(JFK_TEXT)
    used = time.monotonic()
    assert client.models.retrieve("base").loaded  # type: ignore[attr-defined]
    while client.models.retrieve("base").loaded:  # type: ignore[attr-defined]
        assert time.monotonic() - used < TTL_S + 10, "base still loaded long after its TTL"
        time.sleep(0.1)
    assert time.monotonic() - used >= TTL_S - 0.2  # not before its TTL
    time.sleep(TTL_S)
    default = client.models.retrieve("tiny.en")  # idle for longer, but the default model
    assert default.loaded and default.state == "loaded"  # type: ignore[attr-defined]
    assert "unloaded" in ttl_server.log_tail(200)


def test_unbuilt_models_need_downloads_allowed(ttl_server: LiveServer) -> None:
    for model in ("small", "Systran/faster-whisper-large-v3"):
        r = httpx.post(ttl_server.url(f"/v1/models/{model}"), headers=ttl_server.auth)
        error = assert_openai_error(r, 403, param="model")
        assert error["code"] == "model_downloads_disabled"
        assert "STT_MODEL_DOWNLOADS" in error["message"] and model in error["message"]
    listed = httpx.get(ttl_server.url("/v1/models/small"), headers=ttl_server.auth).json()
    assert listed["state"] == "available" and not listed["built"]  # nothing was started


def test_unknown_ids_are_404_with_what_an_id_can_be(ttl_server: LiveServer) -> None:
    for model in ("no-such-model", "a/b/c", "-bad-/name", "org--name", "large-v9"):
        r = httpx.post(ttl_server.url(f"/v1/models/{model}"), headers=ttl_server.auth)
        error = assert_openai_error(r, 404)
        assert error["code"] == "model_not_found", error
        assert "not in the catalog" in error["message"] and "org/name" in error["message"]
    client = openai.OpenAI(base_url=ttl_server.url("/v1"), api_key=KEY, max_retries=0)
    with pytest.raises(openai.NotFoundError, match="no-such-model"):
        client.models.retrieve("no-such-model")
    # a repository id reaches the route whole (the path converter), and is not built here
    r = httpx.get(
        ttl_server.url("/v1/models/Systran/faster-whisper-small"), headers=ttl_server.auth
    )
    error = assert_openai_error(r, 404)
    assert "Systran/faster-whisper-small" in error["message"]
    with pytest.raises(openai.NotFoundError, match="Systran/faster-whisper-small"):
        client.models.retrieve("Systran/faster-whisper-small")
    # an alias's repository id and its other aliases are the alias's one model
    for other in ("openai/whisper-large-v3-turbo", "turbo"):
        assert client.models.retrieve(other).id == "large-v3-turbo"


def test_an_unbuilt_start_up_model_needs_downloads_or_a_cache(tmp_path: Path) -> None:
    """STT_MODELS takes Hub ids; with fetching off and nothing cached the server stays up and
    says why on /health."""
    (tmp_path / "tiny.en").symlink_to(model_dir("tiny.en"), target_is_directory=True)
    settings = Settings(models=["Systran/faster-whisper-small", "tiny.en"], models_dir=tmp_path)
    app = create_app(settings)
    with TestClient(app) as client:
        assert app.state.services.gate.wait_loaded(60)
        r = client.get("/health")
        assert r.status_code == 503 and r.json()["status"] == "failed"
        message = r.json()["error"]
        assert "Systran/faster-whisper-small" in message and "STT_MODEL_DOWNLOADS is off" in message
    assert not (tmp_path / "Systran--faster-whisper-small").exists()  # nothing half-built


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/v1/models"), ("GET", "/v1/models/base"), ("POST", "/v1/models/base"),
     ("DELETE", "/v1/models/tiny.en"), ("POST", "/v1/models/org/name")],
)  # fmt: skip
def test_management_routes_require_the_key(ttl_server: LiveServer, method: str, path: str) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        r = httpx.request(method, ttl_server.url(path), headers=headers, timeout=10)
        error = assert_openai_error(r, 401)
        assert error["code"] == "invalid_api_key"
    assert get_state(ttl_server, "tiny.en") == "loaded"  # the DELETE without the key did nothing


def get_state(server: LiveServer, model: str) -> str:
    r = httpx.get(server.url(f"/v1/models/{model}"), headers=server.auth, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()["state"]


def test_a_live_session_without_its_default_model_loaded_is_refused_cleanly(
    ttl_server: LiveServer,
) -> None:
    """The operator unloaded the default model (autoload off): a live session that would take
    it gets an error naming the model and a close code, not a server error; POST brings it back."""
    r = httpx.delete(ttl_server.url("/v1/models/tiny.en"), headers=ttl_server.auth, timeout=10)
    assert r.status_code == 200 and get_state(ttl_server, "tiny.en") == "available", r.text
    base = ttl_server.base_url.replace("http://", "ws://")
    for path in ("/v1/audio/stream", "/v1/realtime"):
        events, code = asyncio.run(ws_outcome(f"{base}{path}?api_key={KEY}"))
        assert [e["type"] for e in events] == ["error"], (path, events)
        error = events[0]["error"]
        assert error["code"] == "model_not_found" and "POST /v1/models/tiny.en" in error["message"]
        assert code == 1008, (path, code)
    assert "Exception in ASGI application" not in ttl_server.log_tail(200)
    r = httpx.post(ttl_server.url("/v1/models/tiny.en"), headers=ttl_server.auth, timeout=10)
    assert r.status_code == 202, r.text
    deadline = time.monotonic() + 60
    while get_state(ttl_server, "tiny.en") != "loaded":
        assert time.monotonic() < deadline, ttl_server.log_tail()
        time.sleep(0.1)
