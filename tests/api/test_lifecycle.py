"""App lifecycle and failure paths, in process: readiness, start-up and load errors, an error in
the middle of an SSE stream, per-app metrics."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import uvicorn
from fastapi.testclient import TestClient

from app.api.deps import get_models
from app.config import Settings
from app.main import create_app
from app.service.models.leases import Lease
from app.service.models.loaded import LoadedModel
from app.service.models.manager import ModelManager
from tests.api.conftest import JFK_WAV, assert_openai_error, free_port
from tests.conftest import MODELS_DIR, model_dir

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(autouse=True)
def no_stt_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith("STT_"):
            monkeypatch.delenv(key)


def tiny_settings(**overrides: object) -> Settings:
    model_dir("tiny.en")
    return Settings(models=["tiny.en"], models_dir=MODELS_DIR, **overrides)


def jfk_file() -> dict:
    return {"file": ("jfk.wav", JFK_WAV.read_bytes(), "audio/wav")}


def test_health_is_503_while_loading_then_200(monkeypatch: pytest.MonkeyPatch) -> None:
    # loading is held until the early requests are answered: tiny.en loads in about a second,
    # which would otherwise race them
    loading_may_start = threading.Event()
    real_start = ModelManager.start

    def held_start(self: ModelManager, *args: object) -> None:
        assert loading_may_start.wait(60)
        real_start(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(ModelManager, "start", held_start)
    app = create_app(tiny_settings())
    with TestClient(app) as client:
        r = client.get("/health")
        assert r.status_code == 503
        assert r.json()["status"] == "loading" and r.json()["models"] == []
        early = client.post("/v1/audio/transcriptions", files=jfk_file())
        error = assert_openai_error(early, 503)
        assert error["code"] == "loading" and early.headers["retry-after"]
        loading_may_start.set()
        assert app.state.services.gate.wait_loaded(120)
        r = client.get("/health")
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["status"] == "ready"
        assert body["models"][0]["name"] == "tiny.en"
        assert body["models"][0]["warmup_s"] > 0
        assert client.post("/v1/audio/transcriptions", files=jfk_file()).status_code == 200


def test_missing_model_reports_failed_health(tmp_path: Path) -> None:
    """A model folder that is not there: the app starts, /health is 503 with what to do (a
    supervisor restarting a process that exits would loop; test_faults.py checks uvicorn)."""
    app = create_app(Settings(models=["tiny.en", "nope"], models_dir=tmp_path))
    with TestClient(app) as client:
        assert app.state.services.gate.wait_loaded(5)
        r = client.get("/health")
        assert r.status_code == 503 and r.json()["status"] == "failed"
        assert "nope" in r.json()["error"] and "make models" in r.json()["error"]
        error = assert_openai_error(client.get("/v1/models"), 503)
        assert error["code"] == "model_load_failed"


def test_broken_model_reports_failed_health(tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    for name in ("manifest.json", "tokenizer.json"):
        shutil.copy(model_dir("tiny.en") / name, broken / name)
    for name in ("encoder.onnx", "decoder.onnx"):
        (broken / name).write_bytes(b"this is not an onnx graph")
    app = create_app(Settings(models=["broken"], models_dir=tmp_path))
    with TestClient(app) as client:
        assert app.state.services.gate.wait_loaded(60)
        r = client.get("/health")
        assert r.status_code == 503
        assert r.json()["status"] == "failed"
        assert "broken" in r.json()["error"]
        error = assert_openai_error(client.get("/v1/models"), 503)
        assert error["code"] == "model_load_failed"


def test_two_apps_have_separate_metrics() -> None:
    first, second = create_app(tiny_settings()), create_app(tiny_settings())
    a, b = TestClient(first), TestClient(second)  # no lifespan: nothing is loaded
    for _ in range(3):
        a.get("/v1/no-such-route")
    assert 'route="unmatched",status="404"} 3.0' in a.get("/metrics").text
    assert 'status="404"' not in b.get("/metrics").text


# ---- an error in the middle of a stream -------------------------------------------------------
class _ExplodingModel:
    """The real model, whose decode fails after three streamed deltas."""

    def __init__(self, model: LoadedModel) -> None:
        self._model = model
        self.name = model.name

    def __getattr__(self, name: str) -> object:  # what the form reads to build the options
        return getattr(self._model, name)

    def start(self, job, on_delta=None, cancel=None, on_audio=None, on_segment=None):  # type: ignore[no-untyped-def]
        count = 0

        def exploding(text: str) -> None:
            nonlocal count
            count += 1
            on_delta(text)
            if count == 3:
                raise RuntimeError("decoder exploded")

        return self._model.start(
            job, on_delta=exploding, cancel=cancel, on_audio=on_audio, on_segment=on_segment
        )


class _ExplodingModels:
    def __init__(self, models: ModelManager) -> None:
        self._models = models

    async def acquire(self, name: str | None) -> Lease:
        lease = await self._models.acquire(name)
        lease.model = _ExplodingModel(lease.model)  # type: ignore[assignment]
        return lease


@pytest.fixture(scope="module")
def exploding_server() -> Iterator[str]:
    app = create_app(tiny_settings())
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert app.state.services.gate.wait_loaded(120)
    real = app.state.services.models
    app.dependency_overrides[get_models] = lambda: _ExplodingModels(real)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(15)


def test_error_mid_stream_is_an_error_event(exploding_server: str) -> None:
    r = httpx.post(
        exploding_server + "/v1/audio/transcriptions",
        files=jfk_file(),
        data={"stream": "true"},
        timeout=60,
    )
    assert r.status_code == 200
    events = [json.loads(b[len("data: ") :]) for b in r.text.strip().split("\n\n")]
    assert [e["type"] for e in events] == ["transcript.text.delta"] * 3 + ["error"]
    error = events[-1]["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "server_error"
    assert "exploded" not in error["message"]  # internals stay in the log
    health = httpx.get(exploding_server + "/health").json()
    assert health["active"] == 0


def test_sdk_raises_on_error_event(exploding_server: str) -> None:
    client = openai.OpenAI(base_url=exploding_server + "/v1", api_key="x", max_retries=0)
    with JFK_WAV.open("rb") as f:
        stream = client.audio.transcriptions.create(model="tiny.en", file=f, stream=True)
        seen = []
        with pytest.raises(openai.APIError, match="error"):
            for event in stream:
                seen.append(event.type)
    assert seen == ["transcript.text.delta"] * 3


def test_cors_only_when_configured() -> None:
    preflight = {
        "Origin": "http://ui.example",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization",
    }
    on = TestClient(create_app(tiny_settings(cors_origins=["http://ui.example"])))
    r = on.options("/v1/audio/transcriptions", headers=preflight)
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "http://ui.example"
    assert (
        on.options(
            "/v1/audio/transcriptions", headers={**preflight, "Origin": "http://x.example"}
        ).status_code
        == 400
    )
    off = TestClient(create_app(tiny_settings()))
    r = off.options("/v1/audio/transcriptions", headers=preflight)
    assert "access-control-allow-origin" not in r.headers
