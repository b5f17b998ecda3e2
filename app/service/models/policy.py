"""Model management decisions as data: which loaded models to unload, and what a request may do
with a model in a given state. Pure functions, no threads, no clock (the caller passes `now`).

States of a model (what `GET /v1/models/{id}` reports):
`available` (built or fetchable, not loaded) → `building` (fetching + exporting, with a progress
fraction) → `loading` (sessions, warm-up) → `loaded` → `unloading` (DELETE waits for the requests
in flight) → `available` again; a failed build or load leaves `failed` with the error.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from app.service.transcription.jobs import ModelUnavailableError, UnknownModelError

ModelState = Literal["available", "building", "loading", "loaded", "unloading", "failed"]
HOLDING: tuple[ModelState, ...] = ("building", "loading", "loaded", "unloading")  # use memory


@dataclass(frozen=True)
class Resident:
    """A model the manager tracks, as the eviction policy sees it."""

    name: str
    state: ModelState
    last_used: float  # monotonic seconds of the last lease taken or given back
    leases: int  # requests and live sessions using it now
    keep: bool = False  # never unloaded for idleness (the default model)


def plan_evictions(
    residents: Sequence[Resident], now: float, ttl_s: float, max_loaded: int, incoming: int = 0
) -> list[str]:
    """The loaded models to unload now, least recently used first.

    ttl_s: idle models (no lease) unload after this many seconds; < 0 = never, 0 = once idle
    (`keep` models are exempt). max_loaded: most models holding memory at once (building,
    loading, loaded or unloading), counting `incoming` loads about to start; 0 = no limit.
    Only idle `loaded` models are ever chosen, so the result may leave the count above
    `max_loaded` (`over_capacity` tells the caller).
    """
    idle = sorted(
        (r for r in residents if r.state == "loaded" and r.leases == 0),
        key=lambda r: (r.last_used, r.name),
    )
    chosen = [r.name for r in idle if ttl_s >= 0 and not r.keep and now - r.last_used >= ttl_s]
    if max_loaded > 0:
        excess = _held(residents) + incoming - len(chosen) - max_loaded
        for r in idle:
            if excess <= 0:
                break
            if r.name not in chosen:
                chosen.append(r.name)
                excess -= 1
    return chosen


def over_capacity(residents: Sequence[Resident], evicting: Sequence[str], max_loaded: int) -> bool:
    """True when one more load would exceed `max_loaded` even after `evicting` is unloaded."""
    if max_loaded <= 0:
        return False
    return _held(residents) - len(evicting) + 1 > max_loaded


def _held(residents: Sequence[Resident]) -> int:
    return sum(1 for r in residents if r.state in HOLDING)


RequestAction = Literal["use", "wait", "load", "refuse_loading", "refuse_unloading", "not_loaded"]


def request_action(state: ModelState | None, built: bool, autoload: bool) -> RequestAction:
    """What a transcription request naming a model does, by the model's state.

    `use` it (loaded); `wait` for the load in progress, or `load` a built model first (both with
    autoload); otherwise refuse: still loading, being unloaded, or not loaded (an unbuilt model
    is only ever fetched and built by `POST /v1/models/{id}`).
    """
    match state:
        case "loaded":
            return "use"
        case "building" | "loading":
            return "wait" if autoload else "refuse_loading"
        case "unloading":
            return "refuse_unloading"
        case _:
            return "load" if autoload and built else "not_loaded"


def refusal(
    key: str, action: RequestAction, *, built: bool, known: bool, loaded: Sequence[str]
) -> UnknownModelError:
    """The error a request gets when `request_action` did not let it use model `key`."""
    if action == "refuse_loading":
        return ModelUnavailableError(
            key, f"The model '{key}' is loading (STT_MODEL_AUTOLOAD is off); retry once "
            f"GET /v1/models/{key} says it is loaded", "model_loading",
        )  # fmt: skip
    if action == "refuse_unloading":
        return ModelUnavailableError(
            key, f"The model '{key}' is being unloaded; load it again with "
            f"POST /v1/models/{key}", "model_unloading",
        )  # fmt: skip
    detail = None
    if built:
        detail = f"The model '{key}' is not loaded; load it with POST /v1/models/{key}"
    elif known:
        detail = (f"The model '{key}' is not built on this server; POST /v1/models/{key} "
                  f"fetches, builds and loads it")  # fmt: skip
    return UnknownModelError(key, loaded, detail)
