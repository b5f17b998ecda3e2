"""What goes wrong fetching from the Hub gets a clear message and leaves no model folder: unknown,
non-Whisper, gated repositories, offline without a cache, interrupted and truncated downloads
(resumed or refused, never built from a partial file), a full disk. The real huggingface_hub
client talks to the local Hub server of tests/hub_server.py."""

from __future__ import annotations

import filecmp
import json
import re
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hub_repos import CT2_REPO, base_repos, hub_env, run_cli, run_obtain
from tests.hub_server import HubServer

GATED_TOKEN = "hf_test_right_token"


def _repo(root: Path, repo: str, files: dict[str, bytes | Path | None]) -> None:
    folder = root / repo
    folder.mkdir(parents=True)
    for name, content in files.items():
        if content is None:
            continue
        if isinstance(content, Path):
            (folder / name).symlink_to(content)
        else:
            (folder / name).write_bytes(content)


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubServer]:
    root = tmp_path_factory.mktemp("hub")
    ct2 = base_repos() / CT2_REPO
    whisper_config = (base_repos() / "openai/whisper-small/config.json").read_bytes()
    ct2_files = {n: ct2 / n for n in ("config.json", "tokenizer.json", "model.bin")}
    _repo(root, "test-org/ct2-base", ct2_files)
    _repo(root, "test-org/gated-base", ct2_files)
    _repo(
        root,
        "test-org/bert",
        {
            "config.json": json.dumps({"model_type": "bert", "hidden_size": 768}).encode(),
            "tokenizer.json": b"{}",
            "model.safetensors": bytes(1 << 20),
        },
    )
    _repo(
        root,
        "test-org/pytorch-only",
        {"config.json": whisper_config, "tokenizer.json": b"{}", "pytorch_model.bin": bytes(99)},
    )
    _repo(
        root,
        "test-org/vocabulary-only",
        {
            "config.json": ct2 / "config.json",
            "model.bin": ct2 / "model.bin",
            "vocabulary.json": b"[]",
        },
    )
    with HubServer(root, gated={"test-org/gated-base": GATED_TOKEN}) as server:
        yield server


@pytest.fixture
def fresh(hub: HubServer, tmp_path: Path) -> Iterator[HubServer]:
    """The module's server with no fault set and an empty request log; the test's Hugging Face
    cache (tmp_path/hf) is removed afterwards (weights are large)."""
    hub.faults.clear()
    hub.requests.clear()
    hub._cut.clear()
    yield hub
    hub.faults.clear()
    shutil.rmtree(tmp_path / "hf", ignore_errors=True)


def _refused(hub: HubServer, tmp_path: Path, model_id: str, **env: str) -> str:
    """The error of obtaining `model_id` with an empty cache; asserts no model folder is left."""
    models = tmp_path / "models"
    result = run_obtain(hub_env(hub.url, tmp_path / "hf", **env), model_id, models)
    assert "path" not in result, result
    assert not models.exists() or list(models.iterdir()) == []
    return result["error"]


def test_unknown_repository(fresh: HubServer, tmp_path: Path) -> None:
    error = _refused(fresh, tmp_path, "test-org/nosuch")
    assert error == f"no repository test-org/nosuch on {fresh.url} (or it is private: set HF_TOKEN)"


def test_unknown_revision(fresh: HubServer, tmp_path: Path) -> None:
    error = _refused(fresh, tmp_path, "test-org/ct2-base@v9")
    assert error == "test-org/ct2-base has no revision 'v9'"


def test_a_repository_that_is_not_whisper_is_refused_before_its_weights_download(
    fresh: HubServer, tmp_path: Path
) -> None:
    error = _refused(fresh, tmp_path, "test-org/bert")
    assert error == "test-org/bert is not a Whisper model: its config.json has model_type 'bert'"
    assert fresh.fetched() == ["config.json"]


def test_a_repository_with_only_pytorch_weights_is_refused(
    fresh: HubServer, tmp_path: Path
) -> None:
    error = _refused(fresh, tmp_path, "test-org/pytorch-only")
    assert error.startswith("test-org/pytorch-only holds only PyTorch weights")
    assert fresh.fetched() == []


def test_ct2_weights_without_tokenizer_json_are_refused_naming_what_is_missing(
    fresh: HubServer, tmp_path: Path
) -> None:
    error = _refused(fresh, tmp_path, "test-org/vocabulary-only")
    assert "no tokenizer.json (vocabulary.json lacks the BPE merges)" in error
    assert fresh.fetched() == []


@pytest.mark.parametrize("token", [None, "hf_wrong"])
def test_a_gated_repository_needs_the_right_token(
    fresh: HubServer, tmp_path: Path, token: str | None
) -> None:
    env = {"HF_TOKEN": token} if token else {}
    error = _refused(fresh, tmp_path, "test-org/gated-base", **env)
    assert error.startswith("test-org/gated-base is a gated repository: accept its terms")
    assert "set HF_TOKEN" in error
    assert fresh.fetched() == []


def test_a_gated_repository_downloads_with_the_right_token(
    fresh: HubServer, tmp_path: Path
) -> None:
    env = hub_env(fresh.url, tmp_path / "hf", HF_TOKEN=GATED_TOKEN)
    result = run_obtain(env, "test-org/gated-base", tmp_path / "models", fetch_only=True)
    assert filecmp.cmp(Path(result["path"]) / "model.bin", base_repos() / CT2_REPO / "model.bin")


@pytest.mark.parametrize(
    ("env", "allow_download", "reason"),
    [({"HF_HUB_OFFLINE": "1"}, True, "HF_HUB_OFFLINE is set"), ({}, False, "downloads are off")],
)
def test_without_a_cache_offline_or_with_downloads_off_nothing_is_fetched(
    fresh: HubServer, tmp_path: Path, env: dict, allow_download: bool, reason: str
) -> None:
    models = tmp_path / "models"
    result = run_obtain(
        hub_env(fresh.url, tmp_path / "hf", **env),
        "test-org/ct2-base",
        models,
        allow_download=allow_download,
    )
    cache = tmp_path / "hf" / "hub"
    assert result["error"] == (
        f"test-org/ct2-base is not in the Hugging Face cache ({cache}) and {reason}: "
        f"fetch it once with downloads on"
    )
    assert fresh.repo_requests() == [] and not models.exists()


def test_an_interrupted_download_resumes_where_it_stopped(fresh: HubServer, tmp_path: Path) -> None:
    fresh.faults["model.bin"] = "cut_once"
    env = hub_env(fresh.url, tmp_path / "hf")
    result = run_obtain(env, "test-org/ct2-base", tmp_path / "models", fetch_only=True)
    original = base_repos() / CT2_REPO / "model.bin"
    assert filecmp.cmp(Path(result["path"]) / "model.bin", original, shallow=False)
    ranges = [r for verb, path, r in fresh.requests if verb == "GET" and path.endswith("model.bin")]
    assert len(ranges) == 2 and ranges[0] == ""
    resumed_at = int(re.fullmatch(r"bytes=(\d+)-", ranges[1]).group(1))
    assert 0 < resumed_at <= original.stat().st_size // 2  # the second request asked for the rest


def test_a_truncated_download_is_never_built_and_the_next_run_fetches_it_whole(
    fresh: HubServer, tmp_path: Path
) -> None:
    fresh.faults["model.bin"] = "short"
    error = _refused(fresh, tmp_path, "test-org/ct2-base")
    assert error.startswith("downloading test-org/ct2-base failed (Consistency check failed")
    assert error.endswith(
        "nothing was built and the partial file was discarded: run again to retry"
    )
    cached = tmp_path / "hf" / "hub" / "models--test-org--ct2-base"
    assert not list(cached.glob("snapshots/*/model.bin"))  # only complete files get there
    assert not list(cached.glob("blobs/*.incomplete"))  # the partial file is not kept
    fresh.faults.clear()
    env = hub_env(fresh.url, tmp_path / "hf")
    result = run_obtain(env, "test-org/ct2-base", tmp_path / "models", fetch_only=True)
    original = base_repos() / CT2_REPO / "model.bin"
    assert filecmp.cmp(Path(result["path"]) / "model.bin", original, shallow=False)


def test_a_download_cut_every_time_gives_up_clearly(fresh: HubServer, tmp_path: Path) -> None:
    fresh.faults["model.bin"] = "cut_always"
    error = _refused(fresh, tmp_path, "test-org/ct2-base")
    assert error.startswith("downloading test-org/ct2-base was interrupted (RemoteProtocolError")
    assert error.endswith(
        "did not resume; nothing was built and the partial file was discarded: run again to retry"
    )


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 40 MB file system (tmpfs; needs the right to mount, else the test skips)."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=40m", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


def test_a_full_disk_while_downloading_is_named(
    fresh: HubServer, tmp_path: Path, small_disk: Path
) -> None:
    env = hub_env(fresh.url, small_disk / "hf")
    result = run_obtain(env, "test-org/ct2-base", tmp_path / "models")
    assert result["error"].startswith("no space left on the disk while obtaining test-org/ct2-base")
    assert not (tmp_path / "models").exists()


def test_a_full_disk_while_building_leaves_nothing(
    fresh: HubServer, tmp_path: Path, small_disk: Path
) -> None:
    env = hub_env(fresh.url, tmp_path / "hf")
    result = run_obtain(env, "test-org/ct2-base", small_disk)
    assert result["error"].startswith("no space left on the disk while obtaining test-org/ct2-base")
    assert list(small_disk.iterdir()) == []  # the partial build was removed


def test_cli_names_the_problem_without_a_traceback(fresh: HubServer, tmp_path: Path) -> None:
    env = hub_env(fresh.url, tmp_path / "hf")
    done = run_cli(env, "build", "test-org/bert", "--models-dir", tmp_path / "models", "--quiet")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "error: test-org/bert is not a Whisper model: its config.json has model_type 'bert'"
    )
    assert "Traceback" not in done.stderr


def test_an_unreachable_hub_without_a_cache_says_so(tmp_path: Path) -> None:
    with socket.socket() as closed:  # a port nobody listens on
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
    result = run_obtain(hub_env(url, tmp_path / "hf"), "test-org/ct2-base", tmp_path / "models")
    assert result["error"].startswith(
        "test-org/ct2-base is not in the Hugging Face cache"
    ) and result["error"].endswith(f"check the network and HF_ENDPOINT ({url})")
    assert "the Hub cannot be reached" in result["error"]
    assert not (tmp_path / "models").exists()
