"""The server's one gate (`app.service.gate.ServerGate`): which work each state lets in, and why
it refuses the rest — the same refusal on every protocol."""

from __future__ import annotations

import pytest

from app.service.gate import LOADING_RETRY_S, ServerGate


def gate_in(state: str) -> ServerGate:
    gate = ServerGate()
    if state in ("ready", "draining", "stopped"):
        gate.loaded()
    if state == "failed":
        gate.loaded("no model folder models/tiny.en")
    if state in ("draining", "stopped"):
        assert gate.drain()
    if state == "stopped":
        gate.stop()
    assert gate.state == state
    return gate


@pytest.mark.parametrize(
    ("state", "request_refused", "session_refused", "serving"),
    [
        ("loading", "loading", "loading", False),
        ("ready", None, None, True),
        ("failed", "model_load_failed", "model_load_failed", False),
        ("draining", None, "shutting_down", False),  # a load balancer still routes requests
        ("stopped", "shutting_down", "shutting_down", False),
    ],
)
def test_each_state_lets_in_its_work_and_names_its_refusal(
    state: str, request_refused: str | None, session_refused: str | None, serving: bool
) -> None:
    gate = gate_in(state)
    refusals = [gate.refusal("request"), gate.refusal("session")]
    assert [r and r.code for r in refusals] == [request_refused, session_refused]
    assert all(r.kind == "unavailable" for r in refusals if r is not None)
    assert gate.serving is serving


def test_loading_asks_to_retry_and_a_failed_load_says_why() -> None:
    loading = ServerGate().refusal("request")
    assert loading is not None and loading.retry_after_s == LOADING_RETRY_S
    failed = gate_in("failed").refusal("session")
    assert failed is not None and "no model folder models/tiny.en" in failed.message


def test_a_second_shutdown_signal_is_told_apart() -> None:
    gate = gate_in("ready")
    assert gate.drain() is True
    assert gate.drain() is False  # the caller hurries instead
    gate.stop()
    assert gate.drain() is False and gate.state == "stopped"


def test_waiting_for_the_load_ends_when_it_ends() -> None:
    gate = ServerGate()
    assert not gate.wait_loaded(0.01)
    gate.loaded("broken")
    assert gate.wait_loaded(0.01) and gate.state == "failed"
