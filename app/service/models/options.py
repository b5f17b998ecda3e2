"""What the model manager is told (its options, what model ids look like, how to build one)
and what it reports (a model's status)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from app.service.errors import Rejected
from app.service.models.loaded import LoadedModel
from app.service.models.policy import ModelState
from app.service.transcription.jobs import ModelInfo

# (model id, allow_download, on_progress(fraction)) -> the built folder; raises ModelLoadError
Obtain = Callable[[str, bool, Callable[[float], None]], Path]
Listener = Callable[[str, LoadedModel | None], None]  # (name, model) loaded, (name, None) unloaded


class DownloadsDisabledError(Rejected):
    """Loading the model needs new weights and fetching them is off (STT_MODEL_DOWNLOADS)."""

    def __init__(self, message: str) -> None:
        super().__init__("model_downloads_disabled", message, param="model", kind="forbidden")


@dataclass(frozen=True)
class ModelNames:
    """What the composition root knows about model ids (from `app.export.names`)."""

    known: Mapping[str, str] = field(default_factory=dict)  # catalog names, aliases -> description
    model_id: Callable[[str], str] = str  # folder name -> model id
    fetchable: Callable[[str], bool] = lambda _id: False  # a catalog name, alias or repo id
    canonical: Callable[[str], str] = str  # the one id of a model named several ways


@dataclass(frozen=True)
class ManagerOptions:
    ttl_s: float = -1.0  # idle models unload after this long; < 0 = never, 0 = once idle
    max_loaded: int = 0  # most models holding memory at once; 0 = no limit
    autoload: bool = False  # a request naming a built, unloaded model loads it
    downloads: bool = False  # `load` may fetch new weights (else: only what is built or cached)

    def __post_init__(self) -> None:
        if self.max_loaded < 0:
            raise ValueError(f"max_loaded must be >= 0, got {self.max_loaded}")

    @property
    def sweep_every_s(self) -> float | None:
        """How often idle models are looked for (None: no TTL, no sweeper)."""
        return None if self.ttl_s < 0 else min(max(self.ttl_s / 4, 0.25), 5.0)


@dataclass(frozen=True)
class ModelStatus:
    """One model as `GET /v1/models` shows it."""

    id: str
    state: ModelState
    built: bool
    progress: float | None = None  # 0..1 while building
    error: str | None = None  # why the last build or load failed
    created: int = 0  # unix time the folder was built (0: not built)
    leases: int = 0
    description: str | None = None
    info: ModelInfo | None = None  # set when loaded

    @property
    def loaded(self) -> bool:
        return self.info is not None
