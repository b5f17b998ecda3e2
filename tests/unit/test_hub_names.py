"""Model ids: catalog names, aliases of the usual Whisper repositories, repository ids, folders."""

from __future__ import annotations

import subprocess
import sys

import pytest

from app.export.errors import BuildError
from app.export.layouts import pick_layout
from app.export.names import (
    ModelRef,
    canonical_id,
    folder_name,
    known_models,
    model_id,
    resolve_name,
)
from tests.conftest import REPO


@pytest.mark.parametrize(
    ("name", "repo"),
    [
        ("tiny", "openai/whisper-tiny"),
        ("base.en", "openai/whisper-base.en"),
        ("small", "openai/whisper-small"),
        ("medium.en", "openai/whisper-medium.en"),
        ("large-v1", "openai/whisper-large"),
        ("large-v2", "openai/whisper-large-v2"),
        ("large", "openai/whisper-large-v3"),
        ("large-v3", "openai/whisper-large-v3"),
        ("turbo", "openai/whisper-large-v3-turbo"),
        ("large-v3-turbo", "openai/whisper-large-v3-turbo"),
        ("distil-large-v3", "distil-whisper/distil-large-v3"),
        ("distil-large-v3.5", "distil-whisper/distil-large-v3.5"),
        ("distil-small.en", "distil-whisper/distil-small.en"),
    ],
)
def test_aliases_name_their_usual_repositories(name: str, repo: str) -> None:
    assert resolve_name(name) == ModelRef(id=name, kind="hub", repo_id=repo)


def test_catalog_names_win_over_aliases() -> None:
    assert resolve_name("tiny.en") == ModelRef(id="tiny.en", kind="catalog")
    assert resolve_name("base").kind == "catalog"


def test_repository_ids_and_revisions() -> None:
    ref = resolve_name("Systran/faster-whisper-small@v1.0")
    assert (ref.repo_id, ref.revision) == ("Systran/faster-whisper-small", "v1.0")
    assert resolve_name("openai/whisper-small").revision is None


@pytest.mark.parametrize(
    "name",
    ["../tiny.en", "/etc/passwd", "a/../b", "a//b", "a/b/c", "tiny.en/", "./tiny", "x--y/z",
     "a/b@", "a/b@../c", "a/b@x/y", "a/.b", "a/b.", "org/name\x00", "org/name\n", "a/b@main\n",
     "C:\\models\\tiny"],
)  # fmt: skip
def test_hostile_or_malformed_ids_are_refused(name: str) -> None:
    with pytest.raises(BuildError, match=r"invalid|unknown model"):
        resolve_name(name)


def test_an_unknown_plain_name_lists_what_is_known() -> None:
    with pytest.raises(BuildError, match=r"unknown model 'whisper-9'.*turbo.*openai/whisper-small"):
        resolve_name("whisper-9")


def test_folder_names_round_trip() -> None:
    for name in ("small", "tiny.en", "openai/whisper-large-v3-turbo", "org/name@abc"):
        assert model_id(folder_name(name)) == name
    assert folder_name("distil-whisper/distil-large-v3") == "distil-whisper--distil-large-v3"


def test_known_models_cover_catalog_and_aliases() -> None:
    known = known_models()
    assert {"tiny.en", "base", "small", "turbo", "distil-large-v3"} <= set(known)
    assert "openai/whisper-large-v3-turbo" in known["turbo"]


def test_cli_lists_catalog_and_aliases() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "app.export", "list"], capture_output=True, text=True, cwd=REPO
    )
    assert done.returncode == 0
    names = [line.split()[0] for line in done.stdout.splitlines()]
    assert names[:2] == ["tiny.en", "base"] and "large-v3-turbo" in names


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        (["config.json", "tokenizer.json", "model.safetensors", "pytorch_model.bin",
          "model.fp32-00001-of-00002.safetensors", "generation_config.json"],
         ("config.json", "tokenizer.json", "generation_config.json", "model.safetensors")),
        (["config.json", "tokenizer.json", "model-00002-of-00002.safetensors",
          "model-00001-of-00002.safetensors", "model.safetensors.index.json", "flax_model.msgpack"],
         ("config.json", "tokenizer.json", "model.safetensors.index.json",
          "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")),
        (["config.json", "model.bin", "tokenizer.json", "vocabulary.json",
          "preprocessor_config.json", "ggml/model.bin"],
         ("config.json", "tokenizer.json", "model.bin")),
        (["model.bin", "tokenizer.json"], ("tokenizer.json", "model.bin")),
        # both layouts: the Transformers weights (original precision) win
        (["config.json", "tokenizer.json", "model.bin", "model.safetensors"],
         ("config.json", "tokenizer.json", "model.safetensors")),
    ],
)  # fmt: skip
def test_only_a_layouts_files_are_picked(files: list[str], expected: tuple[str, ...]) -> None:
    assert pick_layout(files, "repo").files == expected


@pytest.mark.parametrize(
    ("files", "message"),
    [
        (["config.json", "tokenizer.json", "model-00001-of-00003.safetensors",
          "model-00003-of-00003.safetensors", "model.safetensors.index.json"],
         "incomplete set of weight shards"),
        (["config.json", "tokenizer.json", "model-00001-of-00001.safetensors"],
         "no model.safetensors.index.json"),
        (["config.json", "model.safetensors"], "lacks tokenizer.json"),
        (["README.md"], "holds no Whisper weights"),
    ],
)  # fmt: skip
def test_incomplete_layouts_are_refused(files: list[str], message: str) -> None:
    with pytest.raises(BuildError, match=message):
        pick_layout(files, "repo")


@pytest.mark.parametrize(
    ("name", "canonical"),
    [
        ("large", "large-v3"),
        ("large-v3", "large-v3"),
        ("turbo", "large-v3-turbo"),
        ("openai/whisper-large-v3-turbo", "large-v3-turbo"),
        ("openai/whisper-small", "small"),
        ("openai/whisper-small@main", "openai/whisper-small@main"),  # a pinned revision: its own
        ("Systran/faster-whisper-small", "Systran/faster-whisper-small"),
        ("base", "base"),
    ],
)
def test_a_model_named_several_ways_has_one_id(name: str, canonical: str) -> None:
    assert canonical_id(name) == canonical
