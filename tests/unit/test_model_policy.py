"""The model manager's decisions as data: which models unload (TTL, least recently used) and what
a request does with a model in each state."""

from __future__ import annotations

import pytest

from app.service.models.policy import (
    Resident,
    over_capacity,
    plan_evictions,
    refusal,
    request_action,
)
from app.service.transcription.jobs import ModelUnavailableError, UnknownModelError


def loaded(name: str, last_used: float, leases: int = 0, keep: bool = False) -> Resident:
    return Resident(name, "loaded", last_used, leases, keep)


NOW = 1000.0


def test_ttl_unloads_only_idle_models_past_it() -> None:
    residents = [
        loaded("old", NOW - 120),
        loaded("recent", NOW - 30),
        loaded("old-but-busy", NOW - 500, leases=1),
    ]
    assert plan_evictions(residents, NOW, ttl_s=60, max_loaded=0) == ["old"]


def test_ttl_never_unloads_the_kept_default_model() -> None:
    residents = [loaded("default", NOW - 9999, keep=True), loaded("other", NOW - 9999)]
    assert plan_evictions(residents, NOW, ttl_s=60, max_loaded=0) == ["other"]


def test_negative_ttl_is_off_and_zero_unloads_once_idle() -> None:
    residents = [loaded("a", NOW - 1e6), loaded("b", NOW, leases=2)]
    assert plan_evictions(residents, NOW, ttl_s=-1, max_loaded=0) == []
    assert plan_evictions(residents, NOW, ttl_s=0, max_loaded=0) == ["a"]


def test_lru_makes_room_for_an_incoming_load_least_recently_used_first() -> None:
    residents = [loaded("mid", NOW - 50), loaded("oldest", NOW - 90), loaded("newest", NOW - 1)]
    assert plan_evictions(residents, NOW, ttl_s=-1, max_loaded=3, incoming=1) == ["oldest"]
    assert plan_evictions(residents, NOW, ttl_s=-1, max_loaded=2, incoming=1) == ["oldest", "mid"]
    assert plan_evictions(residents, NOW, ttl_s=-1, max_loaded=4, incoming=1) == []


def test_lru_may_take_the_default_model_but_never_a_busy_one() -> None:
    residents = [loaded("default", NOW - 90, keep=True), loaded("busy", NOW - 99, leases=1)]
    assert plan_evictions(residents, NOW, ttl_s=-1, max_loaded=2, incoming=1) == ["default"]
    busy = [loaded("busy", NOW - 99, leases=1), loaded("busy2", NOW - 98, leases=3)]
    assert plan_evictions(busy, NOW, ttl_s=-1, max_loaded=2, incoming=1) == []
    assert over_capacity(busy, [], max_loaded=2)


def test_models_on_their_way_count_against_the_limit() -> None:
    residents = [
        Resident("building", "building", NOW, 0),
        Resident("leaving", "unloading", NOW - 500, 1),
        loaded("idle", NOW - 10),
        Resident("gone", "available", NOW - 900, 0),
        Resident("broken", "failed", NOW - 900, 0),
    ]
    assert plan_evictions(residents, NOW, ttl_s=-1, max_loaded=3, incoming=1) == ["idle"]
    assert not over_capacity(residents, ["idle"], max_loaded=3)
    assert over_capacity(residents, ["idle"], max_loaded=2)
    assert not over_capacity(residents, [], max_loaded=0)  # 0 = no limit


def test_ttl_and_lru_together_never_name_a_model_twice() -> None:
    residents = [loaded("a", NOW - 100), loaded("b", NOW - 80), loaded("c", NOW - 5)]
    assert plan_evictions(residents, NOW, ttl_s=60, max_loaded=1, incoming=1) == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("state", "built", "autoload", "action"),
    [
        ("loaded", True, False, "use"),
        ("loading", True, True, "wait"),
        ("building", False, True, "wait"),
        ("loading", True, False, "refuse_loading"),
        ("unloading", True, True, "refuse_unloading"),
        (None, True, True, "load"),
        ("available", True, True, "load"),
        ("failed", True, True, "load"),  # a failed load is tried again
        (None, True, False, "not_loaded"),
        (None, False, True, "not_loaded"),  # unbuilt: only POST /v1/models/{id} builds
    ],
)  # fmt: skip
def test_request_action_by_state(
    state: str | None, built: bool, autoload: bool, action: str
) -> None:
    assert request_action(state, built, autoload) == action  # type: ignore[arg-type]


def test_refusals_say_what_to_do() -> None:
    loading = refusal("base", "refuse_loading", built=True, known=True, loaded=["tiny.en"])
    assert isinstance(loading, ModelUnavailableError) and loading.code == "model_loading"
    leaving = refusal("base", "refuse_unloading", built=True, known=True, loaded=[])
    assert isinstance(leaving, ModelUnavailableError) and leaving.code == "model_unloading"
    assert "POST /v1/models/base" in str(leaving)
    unloaded = refusal("base", "not_loaded", built=True, known=True, loaded=[])
    assert "is not loaded; load it with POST /v1/models/base" in str(unloaded)
    unbuilt = refusal("small", "not_loaded", built=False, known=True, loaded=[])
    assert "not built on this server; POST /v1/models/small fetches" in str(unbuilt)
    unknown = refusal("nope", "not_loaded", built=False, known=False, loaded=["tiny.en"])
    assert type(unknown) is UnknownModelError and "loaded models: tiny.en" in str(unknown)
