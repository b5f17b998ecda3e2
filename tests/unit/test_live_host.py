"""The live host (`app.service.live.host`): who is admitted, how a refusal ends a session, the
event queue to a connection, and the shutdown's wait for the last session. Real objects: a
model manager with nothing loaded, a worker pool, the server's gate."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.api.errors import error_type
from app.api.live.connection import close_code
from app.service.errors import Rejected
from app.service.gate import ServerGate
from app.service.live import LiveHost, LiveLimits, Outbox, ending
from app.service.models.manager import ModelManager
from app.service.pool import PoolClosedError, QueueFullError, WorkerPool


def make_host(tmp_path: Path, max_sessions: int = 2, ready: bool = True) -> LiveHost:
    gate = ServerGate()
    if ready:
        gate.loaded()
    models = ModelManager(tmp_path, "tiny.en")
    return LiveHost(models, WorkerPool(1, 1), gate, LiveLimits(), max_sessions)


def refusal_of(host: LiveHost) -> Rejected:
    with pytest.raises(Rejected) as refused:
        host.admit()
    return refused.value


def test_no_session_while_the_models_load_and_the_failure_is_named(tmp_path: Path) -> None:
    async def scenario() -> None:
        host = make_host(tmp_path, ready=False)
        refused = refusal_of(host)
        assert (refused.code, refused.kind, ending(refused)) == ("loading", "unavailable",
                                                                  "try_again")  # fmt: skip
        assert "loading" in refused.message
        host.gate.loaded("no model folder models/tiny.en")
        refused = refusal_of(host)
        assert (refused.code, ending(refused)) == ("model_load_failed", "internal")
        assert "no model folder models/tiny.en" in refused.message
        assert host.count == 0

    asyncio.run(scenario())


def test_no_session_while_the_server_shuts_down(tmp_path: Path) -> None:
    async def scenario() -> None:
        host = make_host(tmp_path)
        host.admit().close()
        host.gate.drain()  # /health says draining; requests are still served
        assert host.gate.refusal("request") is None
        assert refusal_of(host).code == "shutting_down"
        host.gate.stop()  # the live sessions were ended
        refused = refusal_of(host)
        assert (refused.code, ending(refused)) == ("shutting_down", "try_again")

    asyncio.run(scenario())


def test_sessions_over_the_limit_wait_until_one_leaves(tmp_path: Path) -> None:
    async def scenario() -> None:
        host = make_host(tmp_path, max_sessions=2)
        first, second = host.admit(), host.admit()
        refused = refusal_of(host)
        assert (refused.code, refused.kind, ending(refused)) == ("too_many_sessions", "busy",
                                                                  "try_again")  # fmt: skip
        assert "2" in refused.message
        first.close()
        first.close()  # leaving twice counts once
        assert host.count == 1
        with host.admit():
            assert host.count == 2
        second.close()
        assert host.count == 0

    asyncio.run(scenario())


def test_the_shutdown_waits_for_the_last_session(tmp_path: Path) -> None:
    async def scenario() -> None:
        host = make_host(tmp_path)
        await asyncio.wait_for(host.none(), 1)  # none open
        with host.admit(), host.admit():
            waiting = asyncio.ensure_future(host.none())
            await asyncio.sleep(0)
            assert not waiting.done()
        await asyncio.wait_for(waiting, 1)

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("error", "how", "close", "kind_of_error"),
    [
        (Rejected("session_too_long", "m", kind="limit"), "policy", 1008, "invalid_request_error"),
        (Rejected("buffer_overflow", "m", kind="limit"), "policy", 1008, "invalid_request_error"),
        (Rejected("idle_timeout", "m", kind="limit"), "policy", 1008, "invalid_request_error"),
        (Rejected("invalid_api_key", "m", kind="unauthorized"), "policy", 1008,
         "invalid_request_error"),
        (Rejected("message_too_large", "m", kind="limit"), "too_big", 1009,
         "invalid_request_error"),
        (Rejected("timeout", "m", kind="unavailable"), "internal", 1011, "server_error"),
        (Rejected("internal_error", "m", kind="unavailable"), "internal", 1011, "server_error"),
        (PoolClosedError("the server is shutting down"), "try_again", 1013, "server_error"),
        # reported, and the session goes on
        (QueueFullError("busy", 5), None, None, "rate_limit_error"),
        (Rejected("invalid_audio", "m"), None, None, "invalid_request_error"),
        (Rejected("model_not_found", "m", kind="not_found"), None, None,
         "invalid_request_error"),
    ],
)  # fmt: skip
def test_how_each_refusal_ends_a_session_and_its_websocket(
    error: Rejected, how: str | None, close: int | None, kind_of_error: str
) -> None:
    assert ending(error) == how
    assert close_code(error) == close
    assert error_type(error) == kind_of_error


def test_the_newest_partial_replaces_a_waiting_one_and_nothing_else() -> None:
    async def scenario() -> list[str]:
        outbox: Outbox[str] = Outbox()
        outbox.put("partial 1", replaceable=True)
        outbox.put("partial 2", replaceable=True)
        outbox.put("delta")
        outbox.put("partial 3", replaceable=True)
        got = []
        for _ in range(3):
            got.append(await outbox.get())
            outbox.sent()
        return got

    assert asyncio.run(scenario()) == ["partial 2", "delta", "partial 3"]


def test_waiting_for_the_events_to_go_out_ends_when_the_client_is_gone() -> None:
    async def scenario() -> None:
        outbox: Outbox[str] = Outbox()
        await asyncio.wait_for(outbox.wait_sent(asyncio.ensure_future(asyncio.sleep(60))), 1)
        outbox.put("transcript")
        gone = asyncio.ensure_future(asyncio.sleep(0))  # a sender that stopped (write failed)
        await asyncio.wait_for(outbox.wait_sent(gone), 1)
        sender = asyncio.ensure_future(asyncio.sleep(60))
        waiting = asyncio.ensure_future(outbox.wait_sent(sender))
        await asyncio.sleep(0.01)
        assert not waiting.done()  # the event is still waiting to be sent
        assert await outbox.get() == "transcript"
        outbox.sent()
        await asyncio.wait_for(waiting, 1)
        sender.cancel()

    asyncio.run(scenario())
