"""Fetch a Whisper model's weights from the Hugging Face Hub with `huggingface_hub`.

The repository's file list decides the layout (`app.export.layouts`); only that layout's files
are downloaded, with `snapshot_download`, into the standard Hugging Face cache. The library
honours `HF_ENDPOINT`, `HF_HOME`/`HF_HUB_CACHE`, `HF_TOKEN` and `HF_HUB_OFFLINE`, resumes
interrupted files and checks each file's size; a file is only in the snapshot once complete.
"""

from __future__ import annotations

import errno
import logging
import threading
from collections.abc import Callable
from pathlib import Path

import httpx2
from huggingface_hub import HfApi, constants, get_cached_repo_tree, snapshot_download
from huggingface_hub.errors import (
    CachedRepoTreeNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import tqdm as hf_tqdm

from app.export.errors import BuildError
from app.export.layouts import Layout, check_config, pick_layout
from app.export.names import ModelRef
from app.export.sources import ResolvedSource, resolve_local_folder

log = logging.getLogger(__name__)

_BYTES_BAR = "huggingface_hub.snapshot_download"  # the bar of bytes written, over all files


def _listing(ref: ModelRef, online: bool) -> tuple[str, dict[str, int | None], str | None]:
    """(revision to fetch, {file: size}, why the Hub was not asked) for the repository."""
    repo, revision = ref.repo_id or "", ref.revision
    if online:
        try:
            info = HfApi().model_info(repo, revision=revision, files_metadata=True)
            files = {s.rfilename: s.size for s in info.siblings or ()}
            return info.sha or revision or "main", files, None
        except GatedRepoError as e:
            raise BuildError(
                f"{repo} is a gated repository: accept its terms on the Hub, then set HF_TOKEN "
                f"to a token of that account (the Hub said: {_said(e)})"
            ) from e
        except RevisionNotFoundError as e:
            raise BuildError(f"{repo} has no revision {revision!r}") from e
        except RepositoryNotFoundError as e:
            raise BuildError(
                f"no repository {repo} on {constants.ENDPOINT} (or it is private: set HF_TOKEN)"
            ) from e
        except (OfflineModeIsEnabled, httpx2.ConnectError, httpx2.TimeoutException) as e:
            why = f"the Hub cannot be reached ({e})"
        except HfHubHTTPError as e:
            raise BuildError(f"the Hub refused the file list of {repo}: {_said(e)}") from e
    else:
        why = "downloads are off" if not constants.HF_HUB_OFFLINE else "HF_HUB_OFFLINE is set"
    try:
        cached = get_cached_repo_tree(repo, revision=revision)
    except CachedRepoTreeNotFoundError as e:
        raise BuildError(
            f"{repo} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and {why}: "
            f"fetch it once with downloads on"
        ) from e
    return revision or "main", {f.path: f.size for f in cached}, why


def _said(error: HfHubHTTPError) -> str:
    response = error.response
    message = response.headers.get("X-Error-Message") if response is not None else None
    return message or str(error).splitlines()[0]


class _Progress:
    """A tqdm class for `snapshot_download`: counts the bytes written towards `total` for
    `on_progress`, and shows one bar when `show` is set."""

    def __init__(self, total: int, on_progress: Callable[[float], None] | None, show: bool):
        self.total, self.on_progress, self.show = max(total, 1), on_progress, show
        self.done = 0
        self.lock = threading.Lock()

    def add(self, n: float) -> None:
        with self.lock:
            self.done += int(n)
            fraction = min(max(self.done / self.total, 0.0), 1.0)
        if self.on_progress is not None:
            self.on_progress(fraction)

    def bar_class(self, label: str) -> type[hf_tqdm]:
        progress = self

        class _Bar(hf_tqdm):
            def __init__(self, *args, **kwargs) -> None:
                self.counts = kwargs.get("name") == _BYTES_BAR
                if self.counts:
                    kwargs["desc"] = label
                kwargs["disable"] = not (progress.show and self.counts)
                super().__init__(*args, **kwargs)

            def update(self, n: float | None = 1) -> bool | None:
                if self.counts and n:
                    progress.add(n)
                return super().update(n)

        return _Bar


def _download(
    ref: ModelRef, revision: str, files: list[str], online: bool, tqdm_class: type[hf_tqdm]
) -> Path:
    """The snapshot folder holding `files`, complete (downloaded now or found in the cache)."""
    repo = ref.repo_id or ""
    try:
        folder = snapshot_download(
            repo,
            revision=revision,
            allow_patterns=files,
            local_files_only=not online,
            tqdm_class=tqdm_class,
        )
    except OSError as e:
        if e.errno == errno.ENOSPC:
            raise  # obtain_model names the disk
        if isinstance(e, LocalEntryNotFoundError):
            raise BuildError(
                f"{repo}: the cached copy is incomplete and cannot be fetched: {e}"
            ) from e
        raise BuildError(
            f"downloading {repo} failed ({str(e).splitlines()[0]}); nothing was built: run again "
            f"to resume the download"
        ) from e
    except (httpx2.HTTPError, GatedRepoError) as e:
        raise BuildError(
            f"downloading {repo} was interrupted ({type(e).__name__}: {e}); nothing was built: "
            f"run again to resume the download"
        ) from e
    return Path(folder)


def _check_complete(folder: Path, layout: Layout, sizes: dict[str, int | None]) -> None:
    for name in layout.files:
        path, size = folder / name, sizes.get(name)
        if not path.is_file():
            raise BuildError(f"{folder} lacks {name} after the download")
        if size is not None and path.stat().st_size != size:
            raise BuildError(
                f"{name} has {path.stat().st_size} bytes, the repository says {size}: a damaged "
                f"download (delete {path.resolve()} and run again)"
            )


def fetch_snapshot(
    ref: ModelRef,
    *,
    allow_download: bool = True,
    on_progress: Callable[[float], None] | None = None,
    progress_bar: bool = False,
) -> ResolvedSource:
    """The weights of hub model `ref`, downloaded when needed; raises BuildError."""
    online = allow_download and not constants.HF_HUB_OFFLINE
    revision, sizes, why_local = _listing(ref, online)
    online = why_local is None
    repo = ref.repo_id or ""
    layout = pick_layout(sizes, repo)
    if layout.config is not None:
        quiet = _Progress(0, None, show=False).bar_class("")
        check_config(_download(ref, revision, [layout.config], online, quiet), layout, repo)
    progress = _Progress(sum(sizes.get(f) or 0 for f in layout.files), on_progress, progress_bar)
    folder = _download(
        ref, revision, list(layout.files), online, progress.bar_class(f"download {repo}")
    )
    _check_complete(folder, layout, sizes)
    log.info("%s: %s weights in %s", repo, layout.format, folder)
    return resolve_local_folder(
        folder,
        description={
            "kind": "hub",
            "repo_id": repo,
            "revision": folder.name,
            "format": layout.format,
            "path": str(folder),
        },
    )
