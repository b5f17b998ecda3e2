"""The model manager: which models are loaded, loading them on demand, unloading them.

Every model has a state (see `model_policy`). Fetching, building and loading run on a thread of
their own, one per model at a time (requests for a model being loaded share that load); the lock
here only guards the bookkeeping, so a load never stalls requests to other models. Requests and
live sessions hold a `Lease`: `unload` (DELETE) marks a model `unloading`, refuses new requests to
it (409, `model_unloading`) and frees it when the last lease comes back. Idle models unload after
`ttl_s` (never the default model); at most `max_loaded` models hold memory (the least recently
used idle one makes room; when every one is in use a new load is refused, 503 `too_many_models`).
A request naming a built model that is not loaded loads it first (`autoload`); unbuilt models are
only fetched and built by `load` (POST), and only when `downloads` allows fetching new weights.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from app.engine.turn import TurnModel
from app.engine.vad import SileroVad
from app.service.models.catalog import ModelCatalog
from app.service.models.leases import Lease
from app.service.models.loaded import LoadedModel
from app.service.models.opening import (
    ModelLoadError,
    OpenOptions,
    load_turn_model,
    load_vad,
    open_model,
)
from app.service.models.options import (
    DownloadsDisabledError,
    Listener,
    ManagerOptions,
    ModelNames,
    ModelStatus,
    Obtain,
)
from app.service.models.policy import (
    ModelState,
    RequestAction,
    Resident,
    over_capacity,
    plan_evictions,
    refusal,
    request_action,
)
from app.service.transcription.jobs import ModelInfo, ModelUnavailableError, UnknownModelError

log = logging.getLogger(__name__)


@dataclass
class _Entry:
    state: ModelState = "available"
    progress: float | None = None
    error: str | None = None
    model: LoadedModel | None = None
    leases: int = 0
    last_used: float = 0.0
    loading: Future[LoadedModel] | None = None


class ModelManager:
    """Loads, leases and unloads models; thread-safe."""

    def __init__(
        self,
        models_dir: Path,
        default_model: str,
        open_options: OpenOptions | None = None,
        options: ManagerOptions | None = None,
        names: ModelNames | None = None,
        obtain: Obtain | None = None,
        aliases: Mapping[str, str] | None = None,
    ) -> None:
        """aliases: request names meaning another model (OpenAI's names -> the default)."""
        self.catalog = ModelCatalog(models_dir, default_model, names or ModelNames(), aliases or {})
        self.open_options = open_options or OpenOptions()
        self.options = options or ManagerOptions()
        self.vad: SileroVad | None = None
        self.turn_model: TurnModel | None = None
        self._obtain = obtain
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._listeners: list[Listener] = []
        self._stop = threading.Event()
        self._sweeper: threading.Thread | None = None

    # ---- life -------------------------------------------------------------------------------
    def add_listener(self, listener: Listener) -> None:
        """`listener(name, model)` after a load, `listener(name, None)` after an unload."""
        self._listeners.append(listener)

    def start(self, startup: Sequence[str]) -> None:
        """Load the VAD and the start-up models (blocking), then start the idle sweeper.
        Raises `ModelLoadError` naming the model that failed."""
        self.vad = load_vad(self.catalog.models_dir)
        self.turn_model = load_turn_model(self.catalog.models_dir)
        for name in startup:
            future = self._begin(name, from_cache=True)
            if future is not None:
                future.result()
        interval = self.options.sweep_every_s
        if interval is not None and self._sweeper is None:
            self._sweeper = threading.Thread(
                target=self._sweep_loop, args=(interval,), name="stt-model-sweeper", daemon=True
            )
            self._sweeper.start()

    def close(self) -> None:
        """Stop the sweeper and every model's scheduler."""
        self._stop.set()
        with self._lock:
            models = [(n, e.model) for n, e in self._entries.items() if e.model is not None]
        for _name, model in models:
            model.close()

    # ---- names and states -------------------------------------------------------------------
    def resolve(self, name: str | None) -> str:
        """The model id a request's name means (`ModelCatalog.resolve`)."""
        return self.catalog.resolve(name)

    @property
    def loaded(self) -> list[str]:
        with self._lock:
            return [n for n, e in self._entries.items() if e.model is not None]

    def info(self, name: str) -> ModelInfo | None:
        with self._lock:
            entry = self._entries.get(self.resolve(name))
            model = entry.model if entry is not None else None
        return model.info if model is not None else None

    def infos(self) -> list[ModelInfo]:
        with self._lock:
            models = [e.model for e in self._entries.values() if e.model is not None]
        return [m.info for m in models]

    def status(self, name: str) -> ModelStatus:
        """One model's status; `UnknownModelError` if it is neither tracked, built nor known."""
        key = self.resolve(name)
        listing = self.catalog.listing()
        if not self._listed(key, listing):
            raise UnknownModelError(key, self.loaded)
        with self._lock:
            return self._status_locked(key, listing)

    def statuses(self) -> list[ModelStatus]:
        """Every model: tracked ones first, then built folders, then the catalog and aliases."""
        listing = self.catalog.listing()
        with self._lock:
            ids = dict.fromkeys([*self._entries, *listing, *self.catalog.names.known])
            return [self._status_locked(i, listing) for i in ids]

    # ---- loading and unloading --------------------------------------------------------------
    def load(self, name: str) -> ModelStatus:
        """Start fetching/building/loading a model unless it is loaded or on its way (POST)."""
        self._begin(name, from_cache=False)
        return self.status(name)

    def unload(self, name: str) -> ModelStatus:
        """Unload now, or once the requests in flight finish (state `unloading`)."""
        key = self.resolve(name)
        status = self.status(key)  # 404 for an unknown id
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.state in ("available", "failed", "unloading"):
                return status
            if entry.state in ("building", "loading"):
                raise ModelUnavailableError(
                    key, f"The model '{key}' is {entry.state}; unload it once it is loaded",
                    "model_loading",
                )  # fmt: skip
            model = self._drop_locked(key, entry) if entry.leases == 0 else None
            if model is None:
                entry.state = "unloading"
                log.info("model %s: unloading once %d request(s) finish", key, entry.leases)
        if model is not None:
            self._closed(key, model)
        return self.status(key)

    async def acquire(self, name: str | None) -> Lease:
        """A lease on the model `name` names, loading it first if it is built and autoload is
        on (waiting without blocking the loop). Raises `UnknownModelError`,
        `ModelUnavailableError` or `ModelLoadError`."""
        key = self.resolve(name)
        for _attempt in range(3):  # a model may be evicted between its load and our lease
            lease, future = self._lease_or_load(key)
            if lease is not None:
                return lease
            assert future is not None
            await asyncio.shield(asyncio.wrap_future(future))
        raise ModelUnavailableError(
            key, f"The model '{key}' was unloaded as soon as it loaded; retry", "model_unloading"
        )

    def lease_now(self, name: str | None) -> Lease:
        """`acquire` without waiting: a model on its way is `ModelUnavailableError`."""
        key = self.resolve(name)
        lease, _future = self._lease_or_load(key)
        if lease is None:
            raise ModelUnavailableError(
                key, f"The model '{key}' is loading; retry in a few seconds", "model_loading"
            )
        return lease

    def release(self, name: str) -> None:
        """A lease came back (called by `Lease.release`)."""
        with self._lock:
            entry = self._entries[name]
            entry.leases -= 1
            entry.last_used = time.monotonic()
            done = entry.state == "unloading" and entry.leases == 0
            model = self._drop_locked(name, entry) if done else None
        if model is not None:
            self._closed(name, model)

    def sweep(self, now: float | None = None) -> list[str]:
        """Unload the models idle for longer than the TTL; their names."""
        now = time.monotonic() if now is None else now
        with self._lock:
            names = plan_evictions(self._residents_locked(), now, self.options.ttl_s, 0)
            dropped = [(n, self._drop_locked(n, self._entries[n])) for n in names]
        for name, model in dropped:
            log.info("model %s: idle for %.0f s, unloading", name, self.options.ttl_s)
            self._closed(name, model)
        return names

    # ---- internals --------------------------------------------------------------------------
    def _listed(self, key: str, listing: Mapping[str, Path]) -> bool:
        return key in self._entries or self.catalog.listed(key, listing)

    def _known(self, key: str, listing: Mapping[str, Path]) -> bool:
        return self._listed(key, listing) or self.catalog.fetchable(key)

    def _status_locked(self, key: str, listing: Mapping[str, Path]) -> ModelStatus:
        entry = self._entries.get(key) or _Entry()
        folder = listing.get(key)
        info = entry.model.info if entry.model is not None else None
        created = info.created if info else 0
        if folder is not None and not created:
            created = int((folder / "manifest.json").stat().st_mtime)
        return ModelStatus(
            id=key, state=entry.state, built=folder is not None or info is not None,
            progress=entry.progress, error=entry.error, created=created, leases=entry.leases,
            description=self.catalog.names.known.get(key), info=info,
        )  # fmt: skip

    def _residents_locked(self) -> list[Resident]:
        return [
            Resident(n, e.state, e.last_used, e.leases, keep=n == self.catalog.default_model)
            for n, e in self._entries.items()
        ]

    def _lease_or_load(self, key: str) -> tuple[Lease | None, Future[LoadedModel] | None]:
        """A lease when the model is loaded, else the load to wait for (started if need be)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry.model is not None and entry.state == "loaded":
                return self._lease_locked(key, entry), None
        listing = self.catalog.listing()
        with self._lock:
            entry = self._entries.get(key)
            action = request_action(entry and entry.state, key in listing, self.options.autoload)
            if action == "use" and entry is not None:
                return self._lease_locked(key, entry), None
            if action == "wait" and entry is not None and entry.loading is not None:
                return None, entry.loading
            if action == "load":
                future, closing, thread = self._start_locked(key, listing, from_cache=False)
        if action != "load":
            raise self._refusal(key, action, listing)  # outside the lock: it reads `loaded`
        self._launch(closing, thread)
        return None, future

    def _lease_locked(self, key: str, entry: _Entry) -> Lease:
        assert entry.model is not None
        entry.leases += 1
        entry.last_used = time.monotonic()
        return Lease(self, key, entry.model)

    def _refusal(self, key: str, action: RequestAction, listing: Mapping[str, Path]) -> Exception:
        built, known = key in listing, self._known(key, listing)
        return refusal(key, action, built=built, known=known, loaded=self.loaded)

    def _begin(self, name: str, *, from_cache: bool) -> Future[LoadedModel] | None:
        """Start loading `name` unless it is loaded (None) or on its way (that load)."""
        key = self.resolve(name)
        listing = self.catalog.listing()
        if not self._known(key, listing):
            raise UnknownModelError(
                key, self.loaded,
                f"The model '{key}' is not built here, not in the catalog, not an alias and not "
                f"a Hugging Face repository id (org/name)",
            )  # fmt: skip
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry.state in ("loaded", "building", "loading"):
                return entry.loading
            unloading = entry is not None and entry.state == "unloading"
            if not unloading:
                future, closing, thread = self._start_locked(key, listing, from_cache=from_cache)
        if unloading:
            raise self._refusal(key, "refuse_unloading", listing)
        self._launch(closing, thread)
        return future

    def _start_locked(
        self, key: str, listing: Mapping[str, Path], *, from_cache: bool
    ) -> tuple[Future[LoadedModel], list[tuple[str, LoadedModel]], threading.Thread]:
        """Mark the model on its way; the models that make room and the load thread to start
        (`_launch`)."""
        folder = listing.get(key)
        if folder is None and not (self.options.downloads or from_cache):
            raise DownloadsDisabledError(
                f"The model '{key}' is not built on this server and fetching new weights is off "
                f"(STT_MODEL_DOWNLOADS=false): set STT_MODEL_DOWNLOADS=true, or build it with "
                f"`python -m app.export build {key}`"
            )
        residents = self._residents_locked()
        max_loaded = self.options.max_loaded
        evict = plan_evictions(residents, time.monotonic(), -1, max_loaded, incoming=1)
        if over_capacity(residents, evict, max_loaded):
            raise ModelUnavailableError(
                key, f"STT_MAX_LOADED_MODELS={max_loaded} models are loaded or loading and all "
                f"are in use; retry when one is idle or unload one (DELETE /v1/models/{{id}})",
                "too_many_models",
            )  # fmt: skip
        closing = [(n, self._drop_locked(n, self._entries[n])) for n in evict]
        future: Future[LoadedModel] = Future()
        future.set_running_or_notify_cancel()  # a waiter going away never cancels the load
        entry = self._entries.setdefault(key, _Entry())
        entry.state, entry.error, entry.loading = "loading" if folder else "building", None, future
        entry.progress = None if folder else 0.0
        thread = threading.Thread(
            target=self._run_load, args=(key, folder, future), name=f"stt-load-{key}", daemon=True
        )
        return future, closing, thread

    def _run_load(self, key: str, folder: Path | None, future: Future[LoadedModel]) -> None:
        """Loader thread: fetch + build when needed, then open the model."""
        t0 = time.perf_counter()
        try:
            if folder is None:
                folder = self._build(key)
            model = open_model(key, folder, self.open_options, self.vad)
        except Exception as e:
            known = isinstance(e, ModelLoadError)  # its message says it all
            message = str(e) if known else f"{type(e).__name__}: {e}"
            log.error("model %s: load failed: %s", key, message, exc_info=None if known else e)
            with self._lock:
                entry = self._entries[key]
                entry.state, entry.error, entry.loading, entry.progress = (
                    "failed", message, None, None)  # fmt: skip
            future.set_exception(ModelLoadError(message))
            return
        with self._lock:
            entry = self._entries[key]
            entry.state, entry.model, entry.loading, entry.progress = "loaded", model, None, None
            entry.last_used = time.monotonic()
        log.info("model %s: ready after %.2f s", key, time.perf_counter() - t0)
        for listener in self._listeners:
            listener(key, model)
        future.set_result(model)

    def _build(self, key: str) -> Path:
        if self._obtain is None:
            raise ModelLoadError(f"the model '{key}' is not built and this server cannot build")

        def progress(fraction: float) -> None:
            with self._lock:
                self._entries[key].progress = min(max(float(fraction), 0.0), 1.0)

        folder = self._obtain(key, self.options.downloads, progress)
        with self._lock:
            entry = self._entries[key]
            entry.state, entry.progress = "loading", None
        return folder

    def _drop_locked(self, key: str, entry: _Entry) -> LoadedModel:
        model = entry.model
        assert model is not None
        entry.model, entry.state = None, "available"
        return model

    def _closed(self, key: str, model: LoadedModel) -> None:
        """After an unload: stop the model's scheduler, tell the listeners."""
        model.close()
        for listener in self._listeners:
            listener(key, None)
        log.info("model %s: unloaded", key)

    def _launch(self, closing: list[tuple[str, LoadedModel]], thread: threading.Thread) -> None:
        """Unload the models making room first, so their memory is free before the load."""
        if closing:
            log.info("unloading %s (least recently used) to make room", [n for n, _ in closing])
            while closing:
                self._closed(*closing.pop())
            gc.collect()
        thread.start()

    def _sweep_loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.sweep()
            except Exception:
                log.exception("idle model sweep failed")
