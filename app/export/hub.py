"""Fetch a Whisper model's weights from the Hugging Face Hub with `huggingface_hub`.

The repository's file list decides the layout (`app.export.layouts`); only that layout's files
are downloaded, with `snapshot_download`, into the standard Hugging Face cache. The library
honours `HF_ENDPOINT`, `HF_HOME`/`HF_HUB_CACHE`, `HF_TOKEN` and `HF_HUB_OFFLINE`; within a run it
resumes a dropped transfer where it stopped (Range requests, up to 5 times), checks each file's
size, and puts a file in the snapshot only once complete (a failed one is discarded).
"""

from __future__ import annotations

import errno
import logging
import threading
from collections.abc import Callable
from pathlib import Path

import httpx2
from huggingface_hub import (
    HfApi,
    ResolvedRevision,
    constants,
    get_cached_repo_tree,
    snapshot_download,
)
from huggingface_hub.errors import (
    CachedRepoTreeNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
    RevisionResolutionError,
)
from huggingface_hub.utils import tqdm as hf_tqdm

from app.export.errors import BuildError
from app.export.layouts import Layout, check_config, pick_layout
from app.export.names import ModelRef
from app.export.sources import ResolvedSource, resolve_local_folder

log = logging.getLogger(__name__)

_BYTES_BAR = "huggingface_hub.snapshot_download"  # the bar of bytes written, over all files


def _resolve(api: HfApi, ref: ModelRef, online: bool, why_local: str) -> ResolvedRevision:
    """The commit to fetch (the Hub's answer, or the one cached for the revision)."""
    repo = ref.repo_id or ""
    try:
        return api.resolve_revision(repo, revision=ref.revision, local_files_only=not online)
    except GatedRepoError as e:
        raise BuildError(
            f"{repo} is a gated repository: accept its terms on the Hub, then set HF_TOKEN to a "
            f"token of that account (the Hub said: {_said(e)})"
        ) from e
    except RevisionNotFoundError as e:
        raise BuildError(f"{repo} has no revision {ref.revision!r}") from e
    except RepositoryNotFoundError as e:
        raise BuildError(
            f"no repository {repo} on {constants.ENDPOINT} (or it is private: set HF_TOKEN)"
        ) from e
    except RevisionResolutionError as e:
        if e.__cause__ is None:
            raise BuildError(_not_cached(repo, why_local)) from e
        reason = f"the Hub cannot be reached ({e.__cause__})"
        raise BuildError(_not_cached(repo, reason, unreachable=True)) from e
    except HfHubHTTPError as e:
        raise BuildError(f"the Hub refused {repo}: {_said(e)}") from e


def _not_cached(repo: str, reason: str, unreachable: bool = False) -> str:
    fix = (
        f"check the network and HF_ENDPOINT ({constants.ENDPOINT})"
        if unreachable
        else "fetch it once with downloads on"
    )
    return f"{repo} is not in the Hugging Face cache ({constants.HF_HUB_CACHE}) and {reason}: {fix}"


def _listing(
    ref: ModelRef, allow_download: bool
) -> tuple[ResolvedRevision, dict[str, int | None], bool]:
    """(commit to fetch, {file: size}, whether to download) for the repository: the Hub's file
    list, or without the Hub the list cached by an earlier download."""
    repo, api = ref.repo_id or "", HfApi()
    online = allow_download and not constants.HF_HUB_OFFLINE
    why_local = "HF_HUB_OFFLINE is set" if allow_download else "downloads are off"
    revision = _resolve(api, ref, online, why_local)
    unreachable = False
    if online:
        try:
            info = api.model_info(repo, revision=revision.resolved, files_metadata=True)
            return revision, {s.rfilename: s.size for s in info.siblings or ()}, True
        except (OfflineModeIsEnabled, httpx2.TransportError) as e:
            why_local, unreachable = f"the Hub cannot be reached ({e})", True
        except HfHubHTTPError as e:
            raise BuildError(f"the Hub refused the file list of {repo}: {_said(e)}") from e
    try:
        cached = get_cached_repo_tree(repo, revision=revision.resolved)
    except CachedRepoTreeNotFoundError as e:
        raise BuildError(_not_cached(repo, why_local, unreachable)) from e
    return revision, {f.path: f.size for f in cached}, False


def _said(error: HfHubHTTPError) -> str:
    response = error.response
    message = response.headers.get("X-Error-Message") if response is not None else None
    return message or str(error).splitlines()[0]


class _Progress:
    """A tqdm class for `snapshot_download`: counts the bytes written towards `total` (when every
    size is known; else the library's growing total) for `on_progress`, which sees a fraction that
    never goes back; shows one bar when `show` is set."""

    def __init__(self, total: int | None, on_progress: Callable[[float], None] | None, show: bool):
        self.total, self.on_progress, self.show = total, on_progress, show
        self.done, self.reported = 0, 0.0
        self.lock = threading.Lock()

    def add(self, n: float, bar_total: float | None) -> None:
        with self.lock:
            self.done += int(n)
            total = self.total or bar_total or 0
            if total <= 0:
                return
            self.reported = max(self.reported, min(self.done / total, 1.0))
            fraction = self.reported
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
                    progress.add(n, self.total)
                return super().update(n)

        return _Bar


def _download(
    ref: ModelRef,
    revision: ResolvedRevision,
    files: list[str],
    online: bool,
    tqdm_class: type[hf_tqdm],
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
            f"downloading {repo} failed ({str(e).splitlines()[0]}); nothing was built and the "
            f"partial file was discarded: run again to retry"
        ) from e
    except (httpx2.HTTPError, GatedRepoError) as e:
        raise BuildError(
            f"downloading {repo} was interrupted ({type(e).__name__}: {e}) and did not resume; "
            f"nothing was built and the partial file was discarded: run again to retry"
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
    revision, sizes, online = _listing(ref, allow_download)
    repo = ref.repo_id or ""
    layout = pick_layout(sizes, repo)
    if layout.config is not None:
        quiet = _Progress(0, None, show=False).bar_class("")
        check_config(_download(ref, revision, [layout.config], online, quiet), layout, repo)
    needed = [sizes.get(f) for f in layout.files]
    total = None if None in needed else sum(n or 0 for n in needed)
    progress = _Progress(total, on_progress, progress_bar)
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
