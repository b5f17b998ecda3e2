"""Leases: a request or live session holds its model through one, so an unload waits for it.

A `Lease` is given back once (`release()`, or leaving its `with` block); the manager unloads a
model being deleted when its last lease comes back. `SessionModels` is one live session's view of
the models: every model the session resolves stays leased until the session closes.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING

from app.engine.turn import TurnModel
from app.engine.vad import SileroVad
from app.service.models.loaded import LoadedModel
from app.service.transcription.jobs import ModelInfo
from app.service.transcription.transcriber import TranscriptionOptions

if TYPE_CHECKING:
    from app.service.models.manager import ModelManager


class Lease:
    """One user's hold on a loaded model."""

    def __init__(self, manager: ModelManager, name: str, model: LoadedModel) -> None:
        self.name = name
        self.model = model
        self._manager = manager
        self._lock = threading.Lock()
        self._held = True
        self._handed_over = False

    def release_after(self, future: Future) -> None:
        """Give the model back once `future` (a job using it) is done or dropped."""
        self._handed_over = True
        future.add_done_callback(lambda _f: self.release())

    def release_unless_handed_over(self) -> None:
        """Give the model back now, unless a job holds it (`release_after`)."""
        if not self._handed_over:
            self.release()

    def release(self) -> None:
        """Give the model back (idempotent, any thread)."""
        with self._lock:
            held, self._held = self._held, False
        if held:
            self._manager.release(self.name)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()


class SessionModels:
    """What a live session asks of the models: `get` leases the model (until `close()`)."""

    def __init__(self, manager: ModelManager) -> None:
        self._manager = manager
        self._leases: dict[str, Lease] = {}

    @property
    def base_options(self) -> TranscriptionOptions:
        return self._manager.open_options.base_options

    @property
    def vad(self) -> SileroVad | None:
        return self._manager.vad

    @property
    def turn_model(self) -> TurnModel | None:
        return self._manager.turn_model

    @property
    def loaded(self) -> list[str]:
        return self._manager.loaded

    def info(self, name: str) -> ModelInfo | None:
        """The loaded model's info, without leasing it; None when it is not loaded."""
        return self._manager.info(name)

    def get(self, name: str | None) -> LoadedModel:
        """The model `name` names (None = default), leased for the rest of the session; raises
        `UnknownModelError` (or `ModelUnavailableError`: loading, unloading, no room)."""
        key = self._manager.resolve(name)
        lease = self._leases.get(key)
        if lease is None:
            lease = self._leases[key] = self._manager.lease_now(key)
        return lease.model

    def close(self) -> None:
        """Give back every model the session used."""
        leases, self._leases = self._leases, {}
        for lease in leases.values():
            lease.release()
