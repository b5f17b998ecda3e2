"""Live servers for the API tests: real uvicorn processes on loopback ports with models/tiny.en.

`server` (session): default limits. `strict_server` (module, for the limit/auth/queue tests):
API key, 1 worker and no wait queue, 3 MB uploads, 90 s of audio, the voice registry on.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.conftest import AUDIO, MODELS_DIR, REPO, model_dir

JFK_TEXT = (
    "And so my fellow Americans, ask not what your country can do for you, "
    "ask what you can do for your country."
)
JFK_WAV = AUDIO / "jfk.wav"
LONG_WAV = AUDIO / "earnings22_1_4482311_3_62.wav"  # 59.6 s, 24 kHz
STRICT_KEY = "test-key-0123456789"
STARTUP_TIMEOUT_S = 240.0


@dataclass
class LiveServer:
    base_url: str
    process: subprocess.Popen
    log_path: Path
    api_key: str | None = None

    def url(self, path: str) -> str:
        return self.base_url + path

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def log_tail(self, n: int = 60) -> str:
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-n:])


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(
    log_dir: Path,
    name: str,
    *,
    uvicorn_args: Sequence[str] = (),
    expect_ready: bool = True,
    **env_overrides: str,
) -> LiveServer:
    """Start `uvicorn --factory app.main:create_app` (+ `uvicorn_args`) and wait until /health
    is 200 — or, with `expect_ready=False`, until /health answers at all (503 included)."""
    model_dir("tiny.en")  # fails with a clear message if the model is not built
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("STT_")}
    env.update(STT_MODELS="tiny.en", STT_MODELS_DIR=str(MODELS_DIR), STT_LOG_LEVEL="INFO")
    env.update(env_overrides)
    log_path = log_dir / f"{name}.log"
    log_file = log_path.open("w")
    process = subprocess.Popen(
        [
            sys.executable, "-m", "uvicorn", "--factory", "app.main:create_app",
            "--host", "127.0.0.1", "--port", str(port), "--no-access-log", *uvicorn_args,
        ],
        cwd=REPO, env=env, stdout=log_file, stderr=subprocess.STDOUT,
    )  # fmt: skip
    log_file.close()
    server = LiveServer(f"http://127.0.0.1:{port}", process, log_path, env.get("STT_API_KEY"))
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    saw_503 = False
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"server {name} exited with {process.returncode}:\n{server.log_tail()}")
        try:
            r = httpx.get(server.url("/health"), timeout=2.0)
            if r.status_code == 200 or not expect_ready:
                server.saw_503_while_loading = saw_503  # type: ignore[attr-defined]
                return server
            saw_503 = saw_503 or r.status_code == 503
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    stop_server(server)
    pytest.fail(f"server {name} not healthy after {STARTUP_TIMEOUT_S} s:\n{server.log_tail()}")


def stop_server(server: LiveServer) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait(timeout=5)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = start_server(tmp_path_factory.mktemp("server"), "default")
    yield live
    stop_server(live)


@pytest.fixture(scope="module")
def strict_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    folder = tmp_path_factory.mktemp("strict")
    live = start_server(
        folder,
        "strict",
        STT_API_KEY=STRICT_KEY,
        STT_VOICES="true",  # its routes behind the key too
        STT_DATA_DIR=str(folder / "data"),
        STT_WORKERS="1",
        STT_MAX_QUEUE="0",
        STT_MAX_UPLOAD_MB="3",
        STT_MAX_AUDIO_S="90",
    )
    yield live
    stop_server(live)


def normalise(text: str) -> str:
    """Lower case, letters/digits/spaces only, single spaces."""
    kept = "".join(c.lower() if c.isalnum() else " " for c in text)
    return " ".join(kept.split())


def assert_openai_error(response: httpx.Response, status: int, param: str | None = "?") -> dict:
    """The response has `status` and OpenAI's error shape; returns the error object."""
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"], error
    assert isinstance(error["type"], str) and error["type"], error
    if param != "?":
        assert error["param"] == param, error
    return error


@pytest.fixture
def base(server: LiveServer) -> Iterator[str]:
    """The multilingual base on the shared server, loaded for the test and unloaded after it."""
    deadline = time.monotonic() + 180
    while httpx.post(server.url("/v1/models/base"), timeout=10).status_code != 200:
        assert time.monotonic() < deadline, server.log_tail()
        time.sleep(0.5)
    yield "base"
    httpx.delete(server.url("/v1/models/base"), timeout=10)
