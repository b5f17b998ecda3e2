"""A model named by its Hugging Face id is fetched, built and served through the API: a real
server asked `POST /v1/models/{id}` with downloads on and its Hub at a local server speaking the
Hub protocol (HF_ENDPOINT; tests/hub_server.py) transcribes like the catalog build of base, whose
weights the Hub repositories hold (tests/hub_repos.py), in both layouts."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx
import openai
import pytest

from tests.api.conftest import JFK_WAV, start_server, stop_server
from tests.api.test_models_runtime import wait_state
from tests.conftest import MODELS_DIR, model_dir
from tests.hub_repos import CT2_REPO, base_repos
from tests.hub_server import HubServer

pytestmark = pytest.mark.timeout(600)

KEY = "hub-key-0123"


def test_hub_models_are_fetched_built_and_served_like_the_catalog_build(tmp_path: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    for name in ("tiny.en", "base"):
        (models / name).symlink_to(model_dir(name), target_is_directory=True)
    (models / "silero_vad.onnx").symlink_to(MODELS_DIR / "silero_vad.onnx")
    with HubServer(base_repos()) as hub:
        server = start_server(
            tmp_path, "hub",
            STT_MODELS_DIR=str(models), STT_MODEL_DOWNLOADS="true", STT_API_KEY=KEY,
            HF_ENDPOINT=hub.url, HF_HOME=str(tmp_path / "hf-home"),
        )  # fmt: skip
        try:
            client = openai.OpenAI(base_url=server.url("/v1"), api_key=KEY, max_retries=0,
                                   timeout=120)  # fmt: skip
            # the alias's repository id (Transformers layout) and a CTranslate2 repository
            for model in ("openai/whisper-small", CT2_REPO, "base"):
                r = httpx.post(server.url(f"/v1/models/{model}"), headers=server.auth, timeout=10)
                assert r.status_code == 202, r.text
            for model in ("small", CT2_REPO, "base"):
                assert wait_state(server, model, {"loaded", "failed"}, 400)["state"] == "loaded"
            listed = {m.id: m for m in client.models.list()}
            assert listed["small"].loaded and listed[CT2_REPO].loaded  # type: ignore[attr-defined]
            texts = {}
            for model in ("base", "openai/whisper-small", CT2_REPO):
                with JFK_WAV.open("rb") as f:
                    texts[model] = client.audio.transcriptions.create(model=model, file=f).text
            assert texts["base"] and len(set(texts.values())) == 1, texts
            weights = sorted(f for f in hub.fetched() if f.endswith((".bin", ".safetensors")))
            assert weights == [
                "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.bin"
            ]  # fmt: skip
            # the weights, once each layout; no PyTorch or Flax files
        finally:
            stop_server(server)
    shutil.rmtree(tmp_path / "hf-home", ignore_errors=True)  # large downloads and builds
    shutil.rmtree(models, ignore_errors=True)
