"""Models loaded, built and unloaded at run time, against a real server through the `openai` SDK
and HTTP: a build that runs while other requests are served, DELETE while a request is in
flight, autoload, and the least recently used model making room.

The server's models folder starts with tiny.en only (a link to models/tiny.en) and a second link
to it under another name (`tiny-twin`, a third model to fill the slots with); `base` is built in
it by `POST /v1/models/base` from the catalog package `make test-models` cached (no network), a
real build that takes several seconds. At most 2 models stay loaded.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
from websockets.asyncio.client import connect

from tests.api.conftest import (
    JFK_TEXT,
    JFK_WAV,
    LONG_WAV,
    LiveServer,
    assert_openai_error,
    normalise,
    start_server,
    stop_server,
)
from tests.conftest import MODELS_DIR, WEIGHTS_CACHE, model_dir

pytestmark = pytest.mark.timeout(300)

KEY = "models-key-0123"
TRANSCRIBE = "/v1/audio/transcriptions"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    model_dir("base")  # its catalog packages are cached by `make test-models`
    models = tmp_path_factory.mktemp("models")
    (models / "tiny.en").symlink_to(model_dir("tiny.en"), target_is_directory=True)
    (models / "tiny-twin").symlink_to(model_dir("tiny.en"), target_is_directory=True)
    (models / "silero_vad.onnx").symlink_to(MODELS_DIR / "silero_vad.onnx")
    live = start_server(
        tmp_path_factory.mktemp("models-server"), "models",
        STT_MODELS_DIR=str(models), STT_WEIGHTS_CACHE_DIR=str(WEIGHTS_CACHE),
        STT_MODEL_DOWNLOADS="true", STT_MODEL_AUTOLOAD="true", STT_MAX_LOADED_MODELS="2",
        STT_API_KEY=KEY,
        STT_WORKERS="3", STT_MAX_QUEUE="8",
    )  # fmt: skip
    live.models_dir = models  # type: ignore[attr-defined]
    yield live
    stop_server(live)


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url("/v1"), api_key=KEY, max_retries=0, timeout=120)


def get(server: LiveServer, model: str) -> dict:
    r = httpx.get(server.url(f"/v1/models/{model}"), headers=server.auth, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


def transcribe(server: LiveServer, model: str, audio: Path = JFK_WAV) -> httpx.Response:
    files = {"file": (audio.name, audio.read_bytes())}
    return httpx.post(server.url(TRANSCRIBE), headers=server.auth, data={"model": model},
                      files=files, timeout=180)  # fmt: skip


def server_rss_mb(server: LiveServer) -> float:
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def wait_state(server: LiveServer, model: str, states: set[str], timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = get(server, model)
        if body["state"] in states:
            return body
        time.sleep(0.1)
    pytest.fail(f"{model} not in {states} after {timeout} s: {body}\n{server.log_tail()}")


def test_list_shows_loaded_and_loadable_models(client: openai.OpenAI) -> None:
    listed = {m.id: m for m in client.models.list().data}
    assert listed["tiny.en"].loaded and listed["tiny.en"].state == "loaded"  # type: ignore[attr-defined]
    assert listed["tiny.en"].object == "model" and listed["tiny.en"].created > 0
    assert listed["tiny.en"].memory_bytes > 10 * 2**20  # type: ignore[attr-defined]
    twin = listed["tiny-twin"]  # a built folder
    assert (twin.loaded, twin.state, twin.built) == (False, "available", True)  # type: ignore[attr-defined]
    base = listed["base"]  # the catalog: not built here
    assert (base.loaded, base.built) == (False, False)  # type: ignore[attr-defined]
    assert "large-v3-turbo" in listed and "distil-large-v3" in listed  # aliases
    assert client.models.retrieve("whisper-1").id == "tiny.en"  # OpenAI's name: the default


def test_a_build_does_not_stall_requests_to_another_model(server: LiveServer) -> None:
    """POST base builds it from the cached package and loads it; meanwhile transcriptions on
    tiny.en complete, and a second POST joins the load in progress instead of starting one."""
    first = httpx.post(server.url("/v1/models/base"), headers=server.auth, timeout=10)
    assert first.status_code == 202, first.text
    assert first.json()["state"] == "building" and not first.json()["loaded"]
    again = httpx.post(server.url("/v1/models/base"), headers=server.auth, timeout=10)
    assert again.status_code == 202 and again.json()["state"] in ("building", "loading")

    during: list[float] = []  # seconds of each tiny.en request finished while base was loading
    progress: list[float] = []
    with ThreadPoolExecutor(2) as pool:
        while True:
            t0 = time.monotonic()
            answers = list(pool.map(lambda _i: transcribe(server, "tiny.en"), range(2)))
            state = get(server, "base")
            if state["state"] not in ("building", "loading"):
                break
            for r in answers:
                assert r.status_code == 200 and normalise(r.json()["text"]) == normalise(JFK_TEXT)
            during.append(time.monotonic() - t0)
            if state["progress"] is not None:
                progress.append(state["progress"])
    assert state["state"] == "loaded", state
    # the build runs in a child process (~10 s for base): one round must finish inside it
    assert during, "the build ended before a round of requests finished"
    assert max(during) < 30, during  # served at their usual pace, not after the build
    assert progress == sorted(progress) and all(0 <= p <= 1 for p in progress), progress
    assert (server.models_dir / "base" / "manifest.json").is_file()  # type: ignore[attr-defined]
    loads = server.log_path.read_text().count("model base loaded in")
    assert loads == 1, server.log_tail()
    done = httpx.post(server.url("/v1/models/base"), headers=server.auth, timeout=10)
    assert done.status_code == 200 and done.json()["loaded"]  # idempotent
    r = transcribe(server, "base")
    assert r.status_code == 200 and normalise(r.json()["text"]) == normalise(JFK_TEXT)


def test_delete_waits_for_the_request_in_flight(server: LiveServer) -> None:
    if not get(server, "base")["loaded"]:
        assert httpx.post(server.url("/v1/models/base"), headers=server.auth).status_code in (
            200, 202,
        )  # fmt: skip
        wait_state(server, "base", {"loaded"}, 120)
    loaded_mb = server_rss_mb(server)
    with ThreadPoolExecutor(1) as pool:
        long: Future[httpx.Response] = pool.submit(transcribe, server, "base", LONG_WAV)
        deadline = time.monotonic() + 30
        while httpx.get(server.url("/health")).json()["active"] == 0:
            assert time.monotonic() < deadline, "the long request never started"
            time.sleep(0.02)
        deleted = httpx.delete(server.url("/v1/models/base"), headers=server.auth, timeout=10)
        assert deleted.status_code == 202, deleted.text
        assert deleted.json()["state"] == "unloading" and deleted.json()["loaded"]
        refused = transcribe(server, "base")
        error = assert_openai_error(refused, 409, param="model")
        assert error["code"] == "model_unloading" and "POST /v1/models/base" in error["message"]
        assert get(server, "base")["state"] == "unloading"
        answer = long.result(timeout=180)
    assert answer.status_code == 200 and len(answer.json()["text"]) > 200
    gone = wait_state(server, "base", {"available"}, 10)
    assert not gone["loaded"] and gone["built"]
    freed_mb = loaded_mb - server_rss_mb(server)
    assert freed_mb > 100, f"RSS {loaded_mb:.0f} MB with base loaded, {freed_mb:.0f} MB freed"
    again = httpx.delete(server.url("/v1/models/base"), headers=server.auth, timeout=10)
    assert again.status_code == 200 and again.json()["state"] == "available"  # idempotent


def test_a_request_naming_a_built_model_loads_it(server: LiveServer) -> None:
    if get(server, "base")["loaded"]:
        httpx.delete(server.url("/v1/models/base"), headers=server.auth, timeout=10)
        wait_state(server, "base", {"available"}, 60)
    r = transcribe(server, "base")
    assert r.status_code == 200 and normalise(r.json()["text"]) == normalise(JFK_TEXT)
    assert get(server, "base")["loaded"]


def test_a_live_session_holds_its_model_until_it_ends(server: LiveServer) -> None:
    if not get(server, "base")["loaded"]:
        assert transcribe(server, "base").status_code == 200  # autoload

    async def session() -> tuple[httpx.Response, dict, list[dict]]:
        url = server.base_url.replace("http://", "ws://") + f"/v1/audio/stream?api_key={KEY}"
        async with connect(url) as ws:
            assert json.loads(await ws.recv())["type"] == "session.created"
            await ws.send(json.dumps({"type": "session.update", "session": {"model": "base"}}))
            updated = json.loads(await ws.recv())
            assert updated["type"] == "session.updated", updated
            deleted = await asyncio.to_thread(
                httpx.delete, server.url("/v1/models/base"), headers=server.auth, timeout=10
            )
            during = await asyncio.to_thread(get, server, "base")
            await ws.send(json.dumps({"type": "session.close"}))
            return deleted, during, [json.loads(m) async for m in ws]

    deleted, during, events = asyncio.run(session())
    assert deleted.status_code == 202 and deleted.json()["state"] == "unloading", deleted.text
    assert during["state"] == "unloading" and during["in_use"] == 1, during
    assert events[-1]["type"] == "transcript.text.done", events
    assert not wait_state(server, "base", {"available"}, 10)["loaded"]


def test_the_least_recently_used_idle_model_makes_room(server: LiveServer) -> None:
    """Two slots, tiny.en and base loaded: loading tiny-twin unloads the least recently used
    model that has no request in flight (tiny.en is older, but busy: base goes)."""
    for model in ("tiny.en", "base"):
        assert transcribe(server, model).status_code == 200  # both loaded (autoload)
    with ThreadPoolExecutor(1) as pool:
        busy = pool.submit(transcribe, server, "tiny.en", LONG_WAV)  # tiny.en used first ...
        deadline = time.monotonic() + 30
        while httpx.get(server.url("/health")).json()["active"] == 0:
            assert time.monotonic() < deadline, "the long request never started"
            time.sleep(0.02)
        assert transcribe(server, "base").status_code == 200  # ... base after it
        r = httpx.post(server.url("/v1/models/tiny-twin"), headers=server.auth, timeout=10)
        assert r.status_code == 202, r.text
        assert not get(server, "base")["loaded"]
        assert get(server, "tiny.en")["loaded"]
        assert busy.result(timeout=180).status_code == 200
    wait_state(server, "tiny-twin", {"loaded"}, 60)
    loaded = sorted(m["id"] for m in models_json(server) if m["loaded"])
    assert loaded == ["tiny-twin", "tiny.en"]


def test_no_room_when_every_loaded_model_is_busy(server: LiveServer) -> None:
    for model in ("tiny.en", "tiny-twin"):
        if not get(server, model)["loaded"]:
            assert transcribe(server, model).status_code == 200
    stop = threading.Event()

    def keep_busy(model: str) -> None:
        while not stop.is_set():
            transcribe(server, model, LONG_WAV)

    with ThreadPoolExecutor(2) as pool:
        jobs = [pool.submit(keep_busy, m) for m in ("tiny.en", "tiny-twin")]
        deadline = time.monotonic() + 30
        while httpx.get(server.url("/health")).json()["active"] < 2:
            assert time.monotonic() < deadline, "the long requests never started"
            time.sleep(0.02)
        r = httpx.post(server.url("/v1/models/base"), headers=server.auth, timeout=10)
        stop.set()
        error = assert_openai_error(r, 503, param="model")
        assert error["code"] == "too_many_models" and "STT_MAX_LOADED_MODELS=2" in error["message"]
        assert r.headers["retry-after"]
        for job in jobs:
            job.result(timeout=180)


def models_json(server: LiveServer) -> list[dict]:
    r = httpx.get(server.url("/v1/models"), headers=server.auth, timeout=10)
    assert r.status_code == 200
    return r.json()["data"]


def test_health_and_metrics_show_what_is_loaded_and_its_memory(server: LiveServer) -> None:
    loaded = sorted(m["id"] for m in models_json(server) if m["loaded"])
    health = httpx.get(server.url("/health"), timeout=10).json()
    assert sorted(m["name"] for m in health["models"]) == loaded
    assert all(m["memory_bytes"] > 10 * 2**20 for m in health["models"]), health
    text = httpx.get(server.url("/metrics"), headers=server.auth, timeout=10).text
    memory = {
        line.split('"')[1]
        for line in text.splitlines()
        if line.startswith("stt_model_memory_bytes{")
    }
    assert sorted(memory) == loaded
