"""A real uvicorn server for the benchmarks: launched on a free port with a model and settings,
from this checkout or another (a before/after on one machine), healthy before it is returned."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from benchmarks.common import REPO


@dataclass
class Server:
    url: str
    process: subprocess.Popen | None = None

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(
    model: str,
    models_dir: Path,
    workers: int,
    threads: int,
    ep: str,
    extra_env: dict[str, str] | None = None,
    checkout: Path = REPO,
) -> Server:
    """A uvicorn server on a free port, healthy; extra_env adds STT_* settings; `checkout` as
    `launch_server`'s."""
    env = {
        "STT_WORKERS": str(workers),
        "STT_MAX_QUEUE": "64",
        "STT_THREADS": str(threads),
        "STT_EP": ep,
        **(extra_env or {}),
    }
    return launch_server(model, models_dir, env, checkout)


def launch_server(
    model: str,
    models_dir: Path,
    settings: dict[str, str],
    checkout: Path = REPO,
    python: str = sys.executable,
) -> Server:
    """`uvicorn --factory app.main:create_app` on a free port with `model` from `models_dir`,
    the service's defaults overridden by `settings` (STT_* and other variables); returns once
    /health answers 200 (SystemExit if the server dies or is not healthy within 300 s).
    `checkout`: the source tree the server runs from (another `git worktree` runs an older
    version of the service side by side; its `app` package wins over the installed one), and
    `python` the interpreter (a venv with that version's dependencies)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("STT_")}
    env.update(STT_MODELS=model, STT_MODELS_DIR=str(models_dir), STT_LOG_LEVEL="WARNING")
    env.update(settings)
    process = subprocess.Popen(
        [python, "-m", "uvicorn", "--factory", "app.main:create_app",
         "--host", "127.0.0.1", "--port", str(port), "--no-access-log", "--log-level", "warning"],
        cwd=checkout, env=env,
    )  # fmt: skip
    server = Server(f"http://127.0.0.1:{port}", process)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"server exited with {process.returncode}")
        try:
            if httpx.get(server.url + "/health", timeout=2).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    server.stop()
    raise SystemExit("server did not become healthy")


@dataclass(frozen=True)
class Variant:
    """A server to compare: a label, its settings (STT_* and other variables), the source tree
    it runs from and its model folders (None: the benchmark's)."""

    label: str
    settings: dict[str, str]
    checkout: Path = REPO
    models_dir: Path | None = None


VARIANT_HELP = (
    "LABEL:KEY=V,... a server with these settings, e.g. pause0:STT_STREAM_PAUSE_S=0; two keys "
    "are the benchmark's: checkout=DIR runs that server from another source tree (a git worktree "
    "of an older commit), models_dir=DIR gives it its own model folders"
)


def parse_variant(spec: str) -> Variant:
    """A `--variant` argument (`VARIANT_HELP`)."""
    label, _, text = spec.partition(":")
    settings = dict(item.split("=", 1) for item in text.split(",") if item)
    checkout = Path(settings.pop("checkout", REPO))
    models_dir = settings.pop("models_dir", None)
    return Variant(label, settings, checkout, Path(models_dir) if models_dir else None)
